"""``/health``: liveness, without a token."""

from fastapi import APIRouter

API_VERSION = "1"

router = APIRouter(tags=["service"])


@router.get("/health")
async def health() -> dict[str, str]:  # no thread hop: it touches nothing that blocks
    """Liveness without authentication."""
    return {"status": "ok", "api_version": API_VERSION}
