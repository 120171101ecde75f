"""Files a user names are read up to a limit, whatever they are (``reportgen/userfile.py``): a device
or a pipe that never ends is "too large" (exit 2, the file named), not a MemoryError traceback, the
kernel's OOM killer or a hang, as ``/dev/zero`` was for every reader below; a pipe that ends is read."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from reportgen import userfile
from reportgen.cli import main

ROOT = Path(__file__).resolve().parents[1]
TRL = (ROOT / "tests" / "fixtures" / "configs" / "trl_qlora.yaml").read_text()
needs_dev_zero = pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")


def test_read_bytes_reads_at_most_one_byte_past_the_limit(tmp_path):
    small = tmp_path / "small"
    small.write_bytes(b"x" * 10)
    assert userfile.read_bytes(small, 10) == b"x" * 10
    with pytest.raises(userfile.TooLarge) as exc:
        userfile.read_bytes(small, 9)
    assert str(exc.value) == f"{small}: 10 bytes"  # a regular file: its size


@needs_dev_zero
def test_a_file_that_never_ends_is_too_large():
    with pytest.raises(userfile.TooLarge) as exc:
        userfile.read_bytes("/dev/zero", 1000)
    assert str(exc.value) == "/dev/zero: more than 1,000 bytes" and exc.value.size is None


def ds_config(tmp_path: Path) -> str:
    path = tmp_path / "ds.yaml"
    path.write_text(TRL + "deepspeed: /dev/zero\n")
    return str(path)


@needs_dev_zero
@pytest.mark.parametrize("argv,needle", [
    (["sweep", "/dev/zero"], "/dev/zero: more than 1,000,000 bytes; a sweep file is at most 1,000,000 bytes"),
    (["estimate", "--from", "/dev/zero", "--gpu", "t4"], "/dev/zero: more than 1,000,000 bytes; a config file is"),
    (["estimate", "--model", "/dev/zero", "--gpu", "t4"], "/dev/zero: more than 4,000,000 bytes; a config.json is"),
    (["estimate", "--from", ds_config, "--gpu", "t4"], "deepspeed: /dev/zero: more than 1,000,000 bytes; a DeepSpeed"),
    (["compare-published", "--csv", "/dev/zero"], "/dev/zero: more than 10,000,000 bytes; a published-measurements"),
], ids=["sweep", "config", "config.json", "deepspeed", "published-csv"])
def test_every_reader_refuses_a_file_that_never_ends(tmp_path, capsys, argv, needle):
    argv = [a(tmp_path) if callable(a) else a for a in argv]
    t0 = time.perf_counter()
    assert main(argv) == 2
    assert time.perf_counter() - t0 < 10
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err, err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_config_from_a_pipe_is_read(tmp_path, capsys):
    """``--from <(...)``: a FIFO reports no size; what it holds is read as from a file."""
    fifo = tmp_path / "train.yaml"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(TRL), daemon=True)
    writer.start()
    assert main(["estimate", "--from", str(fifo), "--gpu", "rtx-4090", "--format", "json"]) == 0
    writer.join(10)
    assert '"verdict"' in capsys.readouterr().out
