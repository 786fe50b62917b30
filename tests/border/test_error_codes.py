"""The kernel's error word crosses the border as codes: csrc/params.h's ErrorCode and the host's ERROR_TEXT (and the
codes the host acts on) must name the same errors."""
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

from weave_kernel import megakernel as mk  # noqa: E402

PARAMS_H = Path(__file__).resolve().parents[2] / "weave_kernel" / "csrc" / "params.h"


def test_every_kernel_error_code_has_its_host_text():
    body = re.search(r"enum ErrorCode : int32_t \{(.*?)\};", PARAMS_H.read_text(), re.S).group(1)
    codes = {name: int(v) for name, v in re.findall(r"(kErr\w+) = (\d+)", body)}
    assert codes.pop("kErrNone") == 0
    assert set(codes.values()) == set(mk.ERROR_TEXT), "ERROR_TEXT must describe exactly the kernel's error codes"
    assert codes["kErrRecvOverflow"] == mk.ERR_RECV_OVERFLOW
    assert "receive buffer overflow" in mk.ERROR_TEXT[mk.ERR_RECV_OVERFLOW]
