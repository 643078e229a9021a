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
LIB = "nvidia_cutlass_dsl_libs_cu13-{}-cp312-cp312-manylinux_2_28_x86_64.whl"

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


def _wheels(tmp_path, blob, with_fa4=True, version="4.8.1", with_dsl=True):
    """A WHEELS folder as ../shared/tools/fa4-wheels.sh leaves it: the library wheel cut into part_aa / part_ab,
    the other wheels (nvidia_cutlass_dsl of the same ``version``, flash_attn_4) in the last folder. The parts' order
    is their names', not their folders': here the first half sits in folder 2."""
    wheels = tmp_path / ".fa4"
    (wheels / "1").mkdir(parents=True)
    (wheels / "2").mkdir()
    lib = tmp_path / LIB.format(version)
    _wheel(lib, "nvidia_cutlass_dsl_libs_cu13", version, "cp312-cp312-manylinux_2_28_x86_64",
           {"nvidia_cutlass_dsl/lib/libfake.so": blob})
    data = lib.read_bytes()
    half = len(data) // 2
    (wheels / "1" / "part_ab").write_bytes(data[half:])
    (wheels / "2" / "part_aa").write_bytes(data[:half])
    if with_dsl:
        _wheel(wheels / "2" / f"nvidia_cutlass_dsl-{version}-py3-none-any.whl", "nvidia_cutlass_dsl", version,
               "py3-none-any", {"nvidia_cutlass_dsl/__init__.py": b"DSL = 1\n"})
    if with_fa4:
        _wheel(wheels / "2" / "flash_attn_4-4.0.0b36-py3-none-any.whl", "flash_attn_4", "4.0.0b36", "py3-none-any",
               {"flash_attn/cute/__init__.py": b"def flash_attn_func():\n    return 'fa4'\n"})
    return wheels


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """One pack of synthetic wheels in 2 parts: (folder, the library's bytes)."""
    tmp = tmp_path_factory.mktemp("fa4")
    blob = np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8).tobytes()  # incompressible
    _wheels(tmp, blob)
    r = _run("pack", ".fa4", ".fa4x", "2", cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp, blob


def _gather(packed_dir, dst, parts=("1", "2")):
    """The machine's /tmp/fa4x after the calls that carried ``parts``."""
    dst.mkdir()
    for k in parts:
        for p in (packed_dir / ".fa4x" / k).iterdir():
            shutil.copy(p, dst)
    return dst


def test_pack_then_unpack_gives_the_installed_packages(packed, tmp_path):
    tmp, blob = packed
    parts = sorted(p.relative_to(tmp / ".fa4x").as_posix() for p in (tmp / ".fa4x").rglob("fa4site.*"))
    assert parts == ["1/fa4site.of2.part_00", "2/fa4site.of2.part_01"]
    site = tmp_path / "site"
    site.mkdir()
    (site / "hydra").mkdir()  # what the machine's /tmp/site holds already: kept
    r = _run("unpack", str(_gather(tmp, tmp_path / "gpu")), str(site), cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (site / "nvidia_cutlass_dsl/lib/libfake.so").read_bytes() == blob
    assert (site / "flash_attn/cute/__init__.py").read_text().startswith("def flash_attn_func")
    assert (site / "flash_attn_4-4.0.0b36.dist-info").is_dir() and (site / "hydra").is_dir()
    assert (site / ".fa4x_ok").is_file()


def test_unpack_waits_for_every_part(packed, tmp_path):
    tmp, _ = packed
    r = _run("unpack", str(_gather(tmp, tmp_path / "gpu", parts=("1",))), str(tmp_path / "site"), cwd=tmp)
    assert r.returncode == 3 and "1 of 2 parts" in r.stdout, r.stdout + r.stderr
    assert not (tmp_path / "site").exists() or not any((tmp_path / "site").iterdir())


def test_a_corrupt_part_leaves_the_site_as_it_was(packed, tmp_path):
    tmp, _ = packed
    gpu = _gather(tmp, tmp_path / "gpu")
    last = gpu / "fa4site.of2.part_01"
    data = bytearray(last.read_bytes())
    data[len(data) // 2] ^= 0xFF
    last.write_bytes(bytes(data))
    site = tmp_path / "site"
    r = _run("unpack", str(gpu), str(site), cwd=tmp)
    assert r.returncode == 2 and "do not read as one archive" in r.stdout, r.stdout + r.stderr
    assert not site.exists() or not any(site.iterdir())  # nothing half-installed, no .fa4x_ok
    assert not list(tmp_path.glob("site.fa4x.*"))  # the staging folder is gone too


def test_parts_of_two_packs_are_refused(packed, tmp_path):
    tmp, _ = packed
    gpu = _gather(tmp, tmp_path / "gpu")
    shutil.copy(gpu / "fa4site.of2.part_00", gpu / "fa4site.of3.part_02")
    r = _run("unpack", str(gpu), str(tmp_path / "site"), cwd=tmp)
    assert r.returncode == 2 and "parts of different packs" in r.stdout, r.stdout + r.stderr


def test_wheels_without_flash_attn_are_refused(tmp_path):
    _wheels(tmp_path, b"x" * 1000, with_fa4=False)
    r = _run("pack", ".fa4", ".fa4x", "2", cwd=tmp_path)
    assert r.returncode == 2 and "no flash_attn_4 wheel" in r.stdout, r.stdout + r.stderr
    assert not (tmp_path / ".fa4x").exists()


def test_the_library_wheel_takes_the_cutlass_dsl_version(tmp_path):
    """The cut wheel's name (pip needs it whole) comes from nvidia_cutlass_dsl's, not from a version written in."""
    _wheels(tmp_path, b"y" * 1000, version="4.9.2")
    r = _run("pack", ".fa4", ".fa4x", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    site = tmp_path / "site"
    site.mkdir()
    r = _run("unpack", str(tmp_path / ".fa4x" / "1"), str(site), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (site / "nvidia_cutlass_dsl/lib/libfake.so").read_bytes() == b"y" * 1000
    assert (site / "nvidia_cutlass_dsl_libs_cu13-4.9.2.dist-info").is_dir()
    assert (site / "nvidia_cutlass_dsl-4.9.2.dist-info").is_dir()


def test_wheels_without_cutlass_dsl_are_refused(tmp_path):
    _wheels(tmp_path, b"x" * 1000, with_dsl=False)
    r = _run("pack", ".fa4", ".fa4x", "2", cwd=tmp_path)
    assert r.returncode == 2 and "need one nvidia_cutlass_dsl-<version>-*.whl" in r.stdout, r.stdout + r.stderr
    assert not (tmp_path / ".fa4x").exists()


@pytest.mark.parametrize("args, message", [
    ((), "mode must be pack or unpack, got ''"),
    (("zip",), "mode must be pack or unpack, got 'zip'"),
    (("pack", ".nope"), "no .nope/*/part_*"),
    (("pack", ".fa4", ".fa4x", "0"), "PARTS must be an integer in 1-100, got '0'"),
    (("pack", ".fa4", ".fa4x", "00"), "PARTS must be an integer in 1-100, got '00'"),
    (("pack", ".fa4", ".fa4x", "101"), "PARTS must be an integer in 1-100, got '101'"),
    (("pack", ".fa4", ".fa4x", "two"), "PARTS must be an integer in 1-100, got 'two'"),
    (("pack", ".fa4", ".fa4"), "must not be WHEELS"),
    (("pack", ".fa4", ".fa4/out"), "must not be WHEELS"),
    (("unpack",), "usage: bash lab/fa4_pack.sh unpack PARTS_DIR SITE"),
    (("unpack", "empty", "site"), "no empty/fa4site.of*.part_*"),
    (("unpack", "empty", "site", "tritonsite"), "no empty/tritonsite.of*.part_*"),
    (("unpack", "empty", "site", "../x"), "NAME must be lower-case letters and digits, got '../x'"),
])
def test_bad_arguments_exit_2_naming_the_problem(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    _wheels(tmp_path, b"x" * 1000)
    r = _run(*args, cwd=tmp_path)
    assert r.returncode == 2 and message in r.stdout, r.stdout + r.stderr
    assert (tmp_path / ".fa4" / "2" / "part_aa").is_file()  # the wheels untouched


def test_unpack_takes_another_packs_name(tmp_path):
    """``unpack PARTS_DIR SITE NAME``: the parts of lab/triton_pack.sh (``tritonsite.ofN.part_NN``), unpacked once all
    N are in, marked ``SITE/.tritonsite_ok`` (not ``.fa4x_ok``); an fa4site part beside them is not counted."""
    import tarfile

    src = tmp_path / "src" / "triton"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("__version__ = '3.9.0'\n")
    with tarfile.open(tmp_path / "t.tar.xz", "w:xz") as t:
        t.add(src, arcname="triton")
    data = (tmp_path / "t.tar.xz").read_bytes()
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    (gpu / "tritonsite.of2.part_00").write_bytes(data[:len(data) // 2])
    (gpu / "fa4site.of1.part_00").write_bytes(b"not this pack")
    site = tmp_path / "site"
    r = _run("unpack", str(gpu), str(site), "tritonsite", cwd=tmp_path)
    assert r.returncode == 3 and "1 of 2 parts" in r.stdout, r.stdout + r.stderr
    (gpu / "tritonsite.of2.part_01").write_bytes(data[len(data) // 2:])
    r = _run("unpack", str(gpu), str(site), "tritonsite", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (site / "triton" / "__init__.py").read_text() == "__version__ = '3.9.0'\n"
    assert (site / ".tritonsite_ok").is_file() and not (site / ".fa4x_ok").exists()


@pytest.mark.parametrize("args, message", [
    (("3.x",), "VERSION must look like 3.9.0, got '3.x'"),
    (("3.9.0", ".t39", "0"), "PARTS must be an integer in 1-100, got '0'"),
    (("3.9.0", ".t39", "two"), "PARTS must be an integer in 1-100, got 'two'"),
])
def test_triton_pack_bad_arguments_exit_2(tmp_path, args, message):
    r = subprocess.run(["bash", os.path.join(ROOT, "lab", "triton_pack.sh"), *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stdout, r.stdout + r.stderr
    assert not (tmp_path / ".t39").exists()
