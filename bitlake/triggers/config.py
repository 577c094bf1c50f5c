"""The trigger service's configuration: defaults, then a TOML file, then environment variables.

``BITLAKE_TRIGGERS_CONFIG`` names the TOML file (keys are the field names below, at the top level);
each field can also be set as ``BITLAKE_TRIGGERS_<FIELD>`` (e.g. ``BITLAKE_TRIGGERS_DB_URL``), which wins
over the file.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ENV_PREFIX = "BITLAKE_TRIGGERS_"
CONFIG_FILE_ENV = ENV_PREFIX + "CONFIG"
DEFAULT_DB_URL = "sqlite:///./bitlake-triggers.db"


class TriggerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    db_url: str = Field(default=DEFAULT_DB_URL, description="SQLAlchemy URL: sqlite:///PATH or postgresql+psycopg://...")
    max_request_bytes: int = Field(default=16 * 1024 * 1024, ge=1024,
                                   description="Larger request bodies are refused with 413 before parsing")
    max_page_size: int = Field(default=1000, ge=1, le=1000,
                               description="The largest ``limit`` of GET /events and of the triggers' answers; "
                                           "a larger one is refused with 422 (at most 1000)")
    request_timeout_seconds: float = Field(default=30.0, gt=0,
                                           description="A request not answered by then gets 503 with Retry-After")
    rate_limit_per_second: float = Field(default=5000.0, ge=0,
                                         description="Requests per second per token, sustained; over it 429 with "
                                                     "Retry-After (0: no limit)")
    rate_limit_burst: int = Field(default=10000, ge=1,
                                  description="Requests a token may send at once above the sustained rate")
    token_cache_seconds: float = Field(default=5.0, ge=0,
                                       description="How long a verified token is trusted without a lookup")
    pool_size: int = Field(default=5, ge=1, description="Connections kept open (PostgreSQL)")
    max_overflow: int = Field(default=10, ge=0)
    sql_echo: bool = False
    fast_registration: bool = Field(
        default=True, description="Answer valid POST /events without FastAPI's routing (service.FastRegistration); "
                                  "off only to compare")
    freeze_gc: bool = Field(
        default=True, description="gc.freeze() the objects loaded at start-up (docs/triggers.md); off when the app "
                                  "runs inside a larger process")

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> TriggerConfig:
        """The configuration from ``path`` (or ``$BITLAKE_TRIGGERS_CONFIG``) overridden by the environment."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        path = path or env.get(CONFIG_FILE_ENV)
        if path:
            with Path(path).open("rb") as f:
                values.update(tomllib.load(f))
        for name in cls.model_fields:
            if ENV_PREFIX + name.upper() in env:
                values[name] = env[ENV_PREFIX + name.upper()]
        return cls.model_validate(values)
