"""The reference pages under docs/reference/, generated from the code: settings, run config, CLI,
HTTP API and error codes (`python -m asyncgrpo.docs_reference [--check]`). One module per page
kind; `pages` lists them."""
