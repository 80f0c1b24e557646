"""The Files API's storage: a tenant's files (uploaded batch inputs, laneway's batch outputs),
their content in the database so every replica serves the same bytes. The first part of
BatchStore (db/batch_store.py)."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from sqlalchemy import delete, insert, or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.db.batch_records import Clock, FileInfo, file_info, utc
from laneway.db.batch_tables import StoredFile
from laneway.db.models import utcnow

BATCH_OUTPUT = "batch_output"  # the purpose of the files laneway writes


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


def output_file_id(batch_id: str, kind: str) -> str:
    """A batch's output ("output") or error ("error") file id, the same every time for the
    same batch: a finalize done again replaces its files rather than adding a second pair."""
    return "file-" + hashlib.sha256(f"{batch_id}/{kind}".encode()).hexdigest()[:24]


async def replace_file(
    session: AsyncSession, *, file_id: str, tenant_id: int, filename: str, content: bytes | None, now: datetime
) -> str | None:
    """Writes `content` as file `file_id` (purpose batch_output), in place of any file of that
    id; empty or None: no file. The id written, or None."""
    await session.execute(delete(StoredFile).where(StoredFile.id == file_id))
    if not content:
        return None
    await session.execute(
        insert(StoredFile).values(
            id=file_id,
            tenant_id=tenant_id,
            purpose=BATCH_OUTPUT,
            filename=filename,
            size=len(content),
            content=content,
            created_at=now,
        )
    )
    return file_id


class FileStore:
    """A tenant sees its own files only: another tenant's id reads as not found."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], *, clock: Clock = utcnow) -> None:
        self._sessions = sessions
        self._clock = clock

    def _now(self) -> datetime:
        return utc(self._clock())

    async def create_file(self, tenant_id: int, purpose: str, filename: str, content: bytes) -> FileInfo:
        info = FileInfo(new_file_id(), tenant_id, purpose, filename, len(content), self._now())
        async with self._sessions() as session, session.begin():
            await session.execute(
                insert(StoredFile).values(
                    id=info.id,
                    tenant_id=tenant_id,
                    purpose=purpose,
                    filename=filename,
                    size=info.bytes,
                    content=content,
                    created_at=info.created_at,
                )
            )
        return info

    async def get_file(self, tenant_id: int, file_id: str) -> FileInfo | None:
        async with self._sessions() as session:
            row = await self._file_row(session, tenant_id, file_id)
            return None if row is None else file_info(row)

    async def file_content(self, tenant_id: int, file_id: str) -> bytes | None:
        async with self._sessions() as session:
            found = await session.execute(
                select(StoredFile.content).where(StoredFile.id == file_id, StoredFile.tenant_id == tenant_id)
            )
            return found.scalar_one_or_none()

    async def list_files(
        self,
        tenant_id: int,
        *,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = 20,
        order: str = "desc",
    ) -> list[FileInfo]:
        """A page of the tenant's files by creation time, newest first ("desc") or oldest
        first ("asc"); `after` is the last file id of the page before (OpenAI's cursor). An
        `after` that is not one of the tenant's files: an empty page."""
        if order not in ("asc", "desc"):
            raise ValueError(f"order must be 'asc' or 'desc', not {order!r}")
        async with self._sessions() as session:
            query = select(StoredFile).where(StoredFile.tenant_id == tenant_id)
            if purpose is not None:
                query = query.where(StoredFile.purpose == purpose)
            if after is not None:
                cursor = await self._file_row(session, tenant_id, after)
                if cursor is None:
                    return []
                if order == "desc":
                    query = query.where(
                        or_(
                            StoredFile.created_at < cursor.created_at,
                            (StoredFile.created_at == cursor.created_at) & (StoredFile.id < cursor.id),
                        )
                    )
                else:
                    query = query.where(
                        or_(
                            StoredFile.created_at > cursor.created_at,
                            (StoredFile.created_at == cursor.created_at) & (StoredFile.id > cursor.id),
                        )
                    )
            if order == "desc":
                query = query.order_by(StoredFile.created_at.desc(), StoredFile.id.desc())
            else:
                query = query.order_by(StoredFile.created_at, StoredFile.id)
            rows = (await session.execute(query.limit(limit))).scalars().all()
            return [file_info(row) for row in rows]

    async def delete_file(self, tenant_id: int, file_id: str) -> bool:
        async with self._sessions() as session, session.begin():
            gone = await session.execute(
                delete(StoredFile)
                .where(StoredFile.id == file_id, StoredFile.tenant_id == tenant_id)
                .returning(StoredFile.id)
            )
            return gone.first() is not None

    @staticmethod
    async def _file_row(session: AsyncSession, tenant_id: int, file_id: str) -> StoredFile | None:
        found = await session.execute(
            select(StoredFile).where(StoredFile.id == file_id, StoredFile.tenant_id == tenant_id)
        )
        return found.scalar_one_or_none()
