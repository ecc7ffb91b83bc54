"""The package's progress bars (`hf_vit_plus.utils.logging.tqdm`) on a stderr that cannot be written: a full disk or a
file-size limit drops the bar's output instead of raising over the error the run reports; other errors still raise."""

from __future__ import annotations

import errno

import pytest

from hf_vit_plus.utils import logging as hf_logging


class FailingStream:
    def __init__(self, code: int):
        self.code, self.writes = code, 0

    def write(self, text: str) -> int:
        self.writes += 1
        raise OSError(self.code, "cannot write")

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG])
def test_a_bar_on_a_full_disk_stops_writing_and_does_not_raise(code):
    stream = FailingStream(code)
    with hf_logging.tqdm(total=3, delay=0, file=hf_logging._BarStream(stream), disable=False) as bar:
        for _ in range(3):
            bar.update(1)
    assert stream.writes == 1  # the first failed write, then nothing more


def test_other_write_errors_still_raise():
    stream = FailingStream(errno.EBADF)
    with pytest.raises(OSError, match="cannot write"):
        with hf_logging.tqdm(total=1, delay=0, file=hf_logging._BarStream(stream), disable=False) as bar:
            bar.update(1)


def test_the_default_bar_on_a_full_disk_stderr_does_not_raise(monkeypatch):
    stream = FailingStream(errno.ENOSPC)
    monkeypatch.setattr("sys.stderr", stream)
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    try:
        with hf_logging.tqdm(total=2, delay=0) as bar:
            bar.update(2)
    finally:
        if not enabled:
            hf_logging.disable_progress_bar()
    assert stream.writes == 1
