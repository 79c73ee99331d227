import jax
import pytest

jax.config.update("jax_enable_x64", True)

from splitwise_jax._paths import shared_dir  # noqa: E402

SHARED = shared_dir()
needs_shared = pytest.mark.skipif(
    SHARED is None,
    reason="../shared (measured profiles, traces, reference runs) is absent; set SPLITWISE_SHARED to run",
)
