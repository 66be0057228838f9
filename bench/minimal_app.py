"""The yardstick of issue 13: a minimal FastAPI + SQLAlchemy service doing what accepting a
deletion writes (find the sample, insert the request and its task, mark the sample, commit)
and serving a weights blob from the database, with no auth, checks or middleware.

    MINIMAL_DATABASE_URL=sqlite:///x.db .venv/bin/uvicorn bench.minimal_app:app --port P

`bench.request_path` seeds it (`seed`) and drives it with the same load generator as Lethe.
"""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import (
    JSON,
    DateTime,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    create_engine,
    event,
    insert,
    select,
    update,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker


class Base(DeclarativeBase):
    pass


class MinSample(Base):
    __tablename__ = "min_samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(Integer)
    external_id: Mapped[str] = mapped_column(String(200), index=True)
    status: Mapped[str] = mapped_column(String(20), default="active")


class MinRequest(Base):
    __tablename__ = "min_requests"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(Integer)
    selector: Mapped[dict] = mapped_column(JSON)
    sample_ids: Mapped[list] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(20))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class MinTask(Base):
    __tablename__ = "min_tasks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    request_id: Mapped[int] = mapped_column(ForeignKey("min_requests.id"))
    model_id: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20))


class MinBlob(Base):
    __tablename__ = "min_blobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64))
    data: Mapped[bytes] = mapped_column(LargeBinary)


def make_engine(url: str):  # type: ignore[no-untyped-def]
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _wal(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            dbapi_conn.execute("PRAGMA journal_mode=WAL")

        return engine
    return create_engine(url, pool_size=10, max_overflow=20)


def seed(url: str, external_ids: list[str], weights: bytes) -> None:
    """Create the tables and the samples (dataset 1) and one weights blob."""
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.execute(
            insert(MinSample), [{"dataset_id": 1, "external_id": x} for x in external_ids]
        )
        session.add(MinBlob(sha256=hashlib.sha256(weights).hexdigest(), data=weights))
    engine.dispose()


class DeletionBody(BaseModel):
    dataset_id: int
    sample_ids: list[str] = []


app = FastAPI()
_sessions: sessionmaker[Session] | None = None


def sessions() -> sessionmaker[Session]:
    global _sessions
    if _sessions is None:
        _sessions = sessionmaker(bind=make_engine(os.environ["MINIMAL_DATABASE_URL"]))
    return _sessions


@app.post("/deletions", status_code=202)
def create(body: DeletionBody) -> JSONResponse:
    with sessions()() as session, session.begin():
        ids = session.scalars(
            select(MinSample.id).where(
                MinSample.dataset_id == body.dataset_id, MinSample.external_id.in_(body.sample_ids)
            )
        ).all()
        request = MinRequest(
            dataset_id=body.dataset_id,
            selector={"sample_ids": body.sample_ids},
            sample_ids=list(ids),
            status="queued",
            created_at=datetime.now(UTC),
        )
        session.add(request)
        session.flush()
        session.add(MinTask(request_id=request.id, model_id=1, status="queued"))
        session.execute(update(MinSample).where(MinSample.id.in_(ids)).values(status="erasing"))
        view: dict[str, Any] = {"id": request.id, "status": "queued", "n_samples": len(ids)}
    return JSONResponse(view, status_code=202)


@app.get("/weights")
def weights(request: Request) -> Response:
    with sessions()() as session:
        blob = session.scalars(select(MinBlob).limit(1)).one()
        etag = f'"{blob.sha256}"'
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"ETag": etag})
        return Response(blob.data, media_type="application/octet-stream", headers={"ETag": etag})
