"""All SQL of the projects feature."""

from __future__ import annotations

import uuid

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from server.models import Project, Run


def get(session: Session, project_id: uuid.UUID) -> Project | None:
    return session.get(Project, project_id)


def by_name(session: Session, name: str) -> Project | None:
    return session.execute(select(Project).where(Project.name == name)).scalar_one_or_none()


def list_all(session: Session) -> list[Project]:
    return list(session.execute(select(Project).order_by(Project.name)).scalars())


def run_counts(session: Session) -> dict[uuid.UUID, int]:
    """Runs per project (a project with none is absent)."""
    query = select(Run.project_id, func.count()).group_by(Run.project_id)
    return {project_id: int(n) for project_id, n in session.execute(query).all()}


def insert(session: Session, name: str) -> Project | None:
    """The new project; None when the name is taken (a concurrent create included)."""
    project = Project(name=name)
    try:
        with session.begin_nested():
            session.add(project)
            session.flush()
    except IntegrityError:
        return None
    session.refresh(project)
    return project


def rename(session: Session, project: Project, name: str) -> bool:
    """False when the name is taken."""
    try:
        with session.begin_nested():
            project.name = name
            session.flush()
    except IntegrityError:
        return False
    return True
