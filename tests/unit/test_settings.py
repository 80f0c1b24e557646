from pathlib import Path

from laneway.settings import Settings


def test_defaults_are_embedded_sqlite_under_the_data_dir() -> None:
    s = Settings.from_env({})
    assert s.resolved_database_url.startswith("sqlite+aiosqlite:///")
    assert s.resolved_database_url.endswith("laneway-data/laneway.db")
    assert s.resolved_demo_model_path == Path("laneway-data/models/tiny-llama.gguf")


def test_env_values_are_parsed_by_type() -> None:
    s = Settings.from_env(
        {
            "LANEWAY_PORT": "9000",
            "LANEWAY_AUTO_MIGRATE": "false",
            "LANEWAY_AUTH_CACHE_TTL_S": "0.25",
            "LANEWAY_DATA_DIR": "/srv/lw",
            "LANEWAY_REDIS_URL": "",
            "LANEWAY_DATABASE_URL": "postgresql+asyncpg://x/y",
        }
    )
    assert s.port == 9000 and s.auto_migrate is False and s.auth_cache_ttl_s == 0.25
    assert s.data_dir == Path("/srv/lw") and s.redis_url is None
    assert s.resolved_database_url == "postgresql+asyncpg://x/y"


def test_overrides_win_over_env() -> None:
    assert Settings.from_env({"LANEWAY_PORT": "9000"}, port=1234).port == 1234
