"""For tests that need specdec's CPU kernels: they skip where the kernels cannot run (a CPU with
neither AVX512-VNNI nor AVX2, or a build that failed); under SPECDEC_REQUIRE_KERNELS=1, which CI
sets, a failed build raises here instead, so that the run fails rather than skipping them."""

from __future__ import annotations

import pytest

from specdec_cli.kernels import build

KERNELS_RUN = build.available()
needs_kernels = pytest.mark.skipif(not KERNELS_RUN, reason="specdec's CPU kernels do not run here (no AVX512-VNNI "
                                   "or AVX2, or they did not build: SPECDEC_REQUIRE_KERNELS=1 makes that an error)")
