"""lab/fa4_pack.sh: FlashAttention-4's wheels as one tar.xz in parts, and back (synthetic wheels: no network, no
GPU). What lab/gpu_env.sh unpacks on the GPU machine must be what pip would have installed from the wheels."""
import os
import shutil
import subprocess
import zipfile

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "lab", "fa4_pack.sh")
LIB = "nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl"

pytestmark = pytest.mark.skipif(shutil.which("xz") is None, reason="needs the xz tool")


def _wheel(path, name, version, tag, files):
    """A minimal valid wheel: ``files`` ({archive path: bytes}) plus its dist-info (METADATA, WHEEL, RECORD)."""
    info = f"{name}-{version}.dist-info"
    meta = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
            f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()}
    entries = {**files, **meta}
    record = "".join(f"{p},,\n" for p in entries) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, data in entries.items():
            z.writestr(p, data)
        z.writestr(f"{info}/RECORD", record)


def _run(*args, cwd):
    return subprocess.run(["bash", SCRIPT, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_pack_then_unpack_gives_the_installed_packages(tmp_path):
    rng = np.random.default_rng(0)
    blob = rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes()  # incompressible: the parts really split it
    wheels = tmp_path / ".fa4"
    (wheels / "1").mkdir(parents=True)
    (wheels / "2").mkdir()
    _wheel(tmp_path / LIB, "nvidia_cutlass_dsl_libs_cu13", "4.8.1", "cp312-cp312-manylinux_2_28_x86_64",
           {"nvidia_cutlass_dsl/lib/libfake.so": blob})
    data = (tmp_path / LIB).read_bytes()
    half = len(data) // 2
    # the parts' order is their names' (split's aa, ab), not their folders': here the first half sits in folder 2
    (wheels / "1" / "part_ab").write_bytes(data[half:])
    (wheels / "2" / "part_aa").write_bytes(data[:half])
    _wheel(wheels / "2" / "flash_attn_4-4.0.0b36-py3-none-any.whl", "flash_attn_4", "4.0.0b36", "py3-none-any",
           {"flash_attn/cute/__init__.py": b"def flash_attn_func():\n    return 'fa4'\n"})

    r = _run("pack", ".fa4", ".fa4x", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    parts = sorted(p.relative_to(tmp_path / ".fa4x").as_posix() for p in (tmp_path / ".fa4x").rglob("fa4site.part_*"))
    assert parts == ["1/fa4site.part_00", "2/fa4site.part_01"]

    got = tmp_path / "gpu"  # the machine's /tmp/fa4x after the calls: every part in one folder
    got.mkdir()
    for p in (tmp_path / ".fa4x").rglob("fa4site.part_*"):
        shutil.copy(p, got)
    r = _run("unpack", str(got), str(tmp_path / "site"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    site = tmp_path / "site"
    assert (site / "nvidia_cutlass_dsl/lib/libfake.so").read_bytes() == blob
    assert (site / "flash_attn/cute/__init__.py").read_text().startswith("def flash_attn_func")
    assert (site / "flash_attn_4-4.0.0b36.dist-info").is_dir()

    # one part missing: the stream is cut and unpack fails, not a half-installed FA4 reported as fine
    os.remove(got / "fa4site.part_01")
    r = _run("unpack", str(got), str(tmp_path / "site2"), cwd=tmp_path)
    assert r.returncode != 0


@pytest.mark.parametrize("args, message", [
    ((), "mode must be pack or unpack, got ''"),
    (("zip",), "mode must be pack or unpack, got 'zip'"),
    (("pack", ".nope"), "no .nope/*/part_*"),
    (("pack", ".fa4", ".fa4x", "0"), "PARTS must be a positive integer, got '0'"),
    (("pack", ".fa4", ".fa4x", "two"), "PARTS must be a positive integer, got 'two'"),
    (("unpack",), "usage: bash lab/fa4_pack.sh unpack PARTS_DIR SITE"),
    (("unpack", "empty", "site"), "no empty/fa4site.part_*"),
])
def test_bad_arguments_exit_2_naming_the_problem(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    r = _run(*args, cwd=tmp_path)
    assert r.returncode == 2 and message in r.stdout, r.stdout + r.stderr
