// Starts Swagger UI on /docs (a static file: the CSP allows no inline script).
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    const root = document.getElementById("swagger-ui");
    if (!root || typeof SwaggerUIBundle === "undefined") { return; }
    window.ui = SwaggerUIBundle({
      url: root.dataset.openapiUrl,
      dom_id: "#swagger-ui",
      deepLinking: true,
      validatorUrl: null,  // the default badge would call validator.swagger.io
      presets: [SwaggerUIBundle.presets.apis],
      layout: "BaseLayout",
    });
  });
})();
