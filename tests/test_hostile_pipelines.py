"""Pipelines from someone else, forged the way an attacker would: each is refused with an
`UnsafePipelineError` (or loads harmlessly), within a few seconds, and the audit hook
shows that nothing outside the pipeline was opened or written, no socket was used and
no process was started."""
import json
import os
import shutil
import time
import uuid
from pathlib import Path

import pytest
import spacy
import srsly

from spacy_unmask import get_backbone
from spacy_unmask import load as safe_load
from spacy_unmask.opt_ins import FETCH_BASE_ENV, TRUST_REMOTE_CODE_ENV, UnsafePipelineError
from forgery import forged_copy, read_backbone, with_digest
from tiny_models import make_pipeline, save_tiny_model, train_pipeline

TEXT = "Peter Blackburn visited Brussels ."


@pytest.fixture(autouse=True)
def no_opt_ins(monkeypatch):
    monkeypatch.delenv(TRUST_REMOTE_CODE_ENV, raising=False)
    monkeypatch.delenv(FETCH_BASE_ENV, raising=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("hostile-model"), "llama", "metaspace")


def saved_pipeline(model_dir, root: Path, **tok2vec) -> Path:
    nlp = make_pipeline(model_dir, lora_r=4, **tok2vec)
    train_pipeline(nlp, 1)
    nlp.to_disk(root)
    return root


@pytest.fixture(scope="module")
def saved(model_dir, tmp_path_factory):
    return saved_pipeline(model_dir, tmp_path_factory.mktemp("hostile") / "pipeline")


@pytest.fixture(scope="module")
def adapter(model_dir, tmp_path_factory):
    return saved_pipeline(model_dir, tmp_path_factory.mktemp("hostile") / "adapter", save_mode="adapter")


def copy_of(pipeline: Path, tmp_path: Path) -> Path:
    target = tmp_path / f"copy-{uuid.uuid4().hex[:8]}"
    shutil.copytree(pipeline, target)
    return target


def set_tok2vec(pipeline: Path, **values) -> None:
    config = spacy.util.load_config(pipeline / "config.cfg", interpolate=False)
    config["components"]["ner"]["model"]["tok2vec"].update(values)
    config.to_disk(pipeline / "config.cfg")


def refused(audit, load, *allowed, words=()):
    """`load()` raises UnsafePipelineError, touching nothing outside `allowed`, and does not
    hang on what the file declares (a guard against building it, not a speed check: a
    refusal takes seconds, building a forged 50,000-layer decoder would take hours)."""
    start = time.monotonic()
    with audit, pytest.raises(UnsafePipelineError) as info:
        load()
    assert time.monotonic() - start < 300, "refused only after building what the file declares"
    assert audit.outside(*allowed) == []
    for word in words:
        assert word in str(info.value), str(info.value)
    return str(info.value)


def code_folder(tmp_path: Path) -> tuple:
    """A model folder whose config points at Python that writes a marker when it runs."""
    folder, marker = tmp_path / "evil-model", tmp_path / "code-ran"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": {"AutoConfig": "evil.EvilConfig"}}))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    return folder, marker


# --- code runs only with the caller's opt-in -----------------------------------------------


def without_backbone_state(pipeline: Path) -> None:
    model_file = pipeline / "ner" / "model"
    msg = srsly.msgpack_loads(model_file.read_bytes())
    msg["shims"] = [[] for _ in msg["shims"]]
    model_file.write_bytes(srsly.msgpack_dumps(msg))


@pytest.mark.parametrize("loader", [spacy.load, safe_load])
def test_a_pipeline_without_backbone_state_is_damaged(saved, tmp_path, audit, loader):
    path = copy_of(saved, tmp_path)
    folder, marker = code_folder(tmp_path)
    set_tok2vec(path, name=str(folder), trust_remote_code=True)
    without_backbone_state(path)
    refused(audit, lambda: loader(path), path, words=["[ner]", "no state for its decoder backbone"])
    assert not marker.exists()


@pytest.mark.parametrize("save_mode", ["full", "adapter"])
def test_initialize_with_remote_code_needs_the_opt_in(tmp_path, audit, save_mode):
    folder, marker = code_folder(tmp_path)
    nlp = make_pipeline(str(folder), trust_remote_code=True, save_mode=save_mode)
    refused(audit, lambda: train_pipeline(nlp, 1), words=[TRUST_REMOTE_CODE_ENV, "trust_remote_code"])
    assert not marker.exists()


def test_saved_remote_code_needs_the_opt_in_even_with_a_hub_id(saved, tmp_path, audit):
    path = copy_of(saved, tmp_path)
    set_tok2vec(path, name="evil-org/evil-model", trust_remote_code=True)
    message = refused(audit, lambda: spacy.load(path), path, words=[TRUST_REMOTE_CODE_ENV])
    assert "evil-org" not in message  # a config value is never echoed


# --- the tokenizer is data -------------------------------------------------------------------


def edit_tokenizer_config(**keys):
    def forge(b):
        config = json.loads(b["tokenizer"]["tokenizer_config.json"])
        config.update(keys)
        b["tokenizer"]["tokenizer_config.json"] = json.dumps(config).encode()

    return forge


def test_tokenizer_config_cannot_point_at_files_or_classes(saved, tmp_path, audit):
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(saved / "vocab" / "strings.json", outside / "tokenizer.json")  # any file will do: it is never opened
    forge = edit_tokenizer_config(
        fast_tokenizer_files=[str(outside / "tokenizer.json"), "../../outside/tokenizer.json"],
        tokenizer_file=str(outside / "tokenizer.json"),
        tokenizer_class="BertTokenizerFast",
        name_or_path=str(outside),
    )
    path = forged_copy(saved, tmp_path, forge)
    with audit:
        nlp = spacy.load(path)
    assert audit.outside(path) == []
    assert type(get_backbone(nlp).tokenizer).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend")
    assert nlp(TEXT) is not None


def test_tokenizer_files_that_are_not_tokenizer_data_are_ignored(saved, tmp_path, audit):
    def forge(b):
        b["tokenizer"]["config.json"] = json.dumps({"model_type": "evil", "auto_map": {"AutoConfig": "x.Y"}}).encode()
        b["tokenizer"]["tokenizer.model"] = b"not a sentencepiece model"

    path = forged_copy(saved, tmp_path, forge)
    with audit:
        spacy.load(path)
    assert audit.outside(path) == []


@pytest.mark.parametrize(
    "forge, words",
    [
        (edit_tokenizer_config(bos_token="<never-seen>"), ["'bos_token'", "not a piece"]),
        (edit_tokenizer_config(pad_token=["a", "list"]), ["'pad_token'", "non-empty string"]),
        (edit_tokenizer_config(padding_side="middle"), ["'padding_side'"]),
        (lambda b: b["tokenizer"].__setitem__("tokenizer_config.json", b"[" * 100_000), ["nested too deeply"]),
        (lambda b: b["tokenizer"].__setitem__("tokenizer.json", b"{" * 100_000), ["'tokenizer.json'"]),
        (lambda b: b["tokenizer"].pop("tokenizer.json") and None, ["no 'tokenizer.json'"]),
        (lambda b: b["tokenizer"].__setitem__("x" * 300 + ".json", b"{}"), ["not a plain file name"]),
    ],
)
def test_forged_tokenizer_data_is_refused(saved, tmp_path, audit, forge, words):
    path = forged_copy(saved, tmp_path, forge)
    refused(audit, lambda: spacy.load(path), path, words=["[ner]"] + words)


def test_tokenizer_ids_beyond_the_embedding_are_refused(saved, tmp_path, audit):
    def forge(b):
        tokenizer = json.loads(b["tokenizer"]["tokenizer.json"])
        tokenizer["added_tokens"].append(
            {"id": 10**6, "content": "<far>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
        )
        b["tokenizer"]["tokenizer.json"] = json.dumps(tokenizer).encode()

    path = forged_copy(saved, tmp_path, forge)
    refused(audit, lambda: spacy.load(path), path, words=["beyond the", "rows of the decoder's embedding"])


# --- declared sizes -----------------------------------------------------------------------------


def edit_config(**keys):
    def forge(b):
        config = json.loads(b["config"])
        config.update(keys)
        b["config"] = json.dumps(config)

    return forge


@pytest.mark.parametrize(
    "forge, words",
    [
        (edit_config(num_hidden_layers=50_000), ["'num_hidden_layers'", "from 1 to 512"]),
        (edit_config(num_hidden_layers=300), ["'num_hidden_layers'", "number of layers the weights hold (4)"]),
        (edit_config(num_hidden_layers=-1), ["'num_hidden_layers'"]),
        (edit_config(num_attention_heads=0), ["'num_attention_heads'"]),
        (edit_config(num_key_value_heads=3), ["'num_key_value_heads'", "divide"]),
        (edit_config(hidden_size=4096), ["shape"]),
        (edit_config(vocab_size=1 << 21), ["shape"]),
        (edit_config(intermediate_size=True), ["'intermediate_size'"]),
        (edit_config(pad_token_id=10**9), ["'pad_token_id'"]),
        (lambda b: b.__setitem__("config", "[" * 100_000), ["nested too deeply"]),
    ],
)
def test_declared_sizes_are_checked_before_anything_is_built(saved, tmp_path, audit, forge, words):
    import tracemalloc

    path = forged_copy(saved, tmp_path, forge)
    tracemalloc.start()
    try:
        message = refused(audit, lambda: spacy.load(path), path, words=["[ner]", "field 'config'" if "shape" not in words else "field 'weights'"] + words)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 << 20, f"{peak} bytes taken to refuse it"
    assert "50000" not in message


def test_forged_weight_shapes_are_refused(saved, tmp_path, audit):
    import torch
    from safetensors.torch import load, save

    def forge(b):
        state = load(b["weights"])
        name = next(k for k in state if k.endswith("embed_tokens.weight"))
        state[name] = torch.zeros(3, 3)
        b["weights"] = save(state)
        return with_digest(b)

    path = forged_copy(saved, tmp_path, forge)
    refused(audit, lambda: spacy.load(path), path, words=["embed_tokens.weight", "shape"])


# --- the folder is not trusted as a file system -----------------------------------------------


def test_a_linked_config_is_not_read(saved, tmp_path, audit):
    secret = tmp_path / "secret.txt"
    secret.write_text("[secret]\nsecret-value = 1\n")
    path = copy_of(saved, tmp_path)
    (path / "config.cfg").unlink()
    (path / "config.cfg").symlink_to(secret)
    message = refused(audit, lambda: safe_load(path), path, words=["'config.cfg'", "symbolic link"])
    assert "secret" not in message.replace(str(path), "")


@pytest.mark.parametrize("where", ["ner/model", "ner/cfg", "config.cfg"])
def test_a_fifo_does_not_stall_loading(saved, tmp_path, audit, where):
    path = copy_of(saved, tmp_path)
    (path / where).unlink()
    os.mkfifo(path / where)
    refused(audit, lambda: safe_load(path), path, words=[repr(where), "FIFO"])
    if where != "config.cfg":  # plain spacy.load reads config.cfg itself; the component checks its own folder
        refused(audit, lambda: spacy.load(path), path, words=["FIFO"])


def test_a_link_to_an_endless_device_is_refused(saved, tmp_path, audit):
    path = copy_of(saved, tmp_path)
    (path / "ner" / "model").unlink()
    (path / "ner" / "model").symlink_to("/dev/zero")
    refused(audit, lambda: spacy.load(path), path, words=["'model'", "symbolic link"])


def test_a_linked_component_folder_is_refused(saved, tmp_path, audit):
    path = copy_of(saved, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(path / "ner"), elsewhere)
    (path / "ner").symlink_to(elsewhere, target_is_directory=True)
    refused(audit, lambda: safe_load(path), path, words=["'ner'", "symbolic link"])


def test_oversized_config_files_are_refused(saved, tmp_path, audit):
    path = copy_of(saved, tmp_path)
    with (path / "ner" / "cfg").open("ab") as f:
        f.truncate(17 << 20)  # sparse: no disk taken
    refused(audit, lambda: spacy.load(path), path, words=["'cfg'", "more than"])


def test_config_reading_files_outside_is_refused(saved, tmp_path, audit):
    outside = tmp_path / "labels.json"
    outside.write_text(json.dumps("secret-value"))
    path = copy_of(saved, tmp_path)
    set_tok2vec(path, unmask={"@readers": "spacy.read_labels.v1", "path": str(outside)})
    message = refused(audit, lambda: safe_load(path), path, words=["@readers"])
    assert "secret-value" not in message


def test_a_config_value_is_never_echoed(saved, tmp_path, audit):
    path = copy_of(saved, tmp_path)
    set_tok2vec(path, lora_r="secret-value")
    message = refused(audit, lambda: safe_load(path), path)
    assert "secret-value" not in message


def test_saving_never_writes_through_a_link(saved, tmp_path):
    nlp = spacy.load(saved)
    path = copy_of(saved, tmp_path)
    target = tmp_path / "written-through"
    (path / "ner" / "model").unlink()
    (path / "ner" / "model").symlink_to(target)  # dangling
    with pytest.raises(UnsafePipelineError, match="symbolic link"):
        nlp.to_disk(path)
    assert not target.exists()


# --- adapter pipelines: pinned, local by default ------------------------------------------------


@pytest.mark.parametrize("name", ["/abs/evil-base", "../evil-base", "~/evil-base", "evil-org/evil-model", "smollm2-135m"])
def test_adapter_base_is_not_read_or_fetched_without_the_opt_in(adapter, tmp_path, audit, monkeypatch, name):
    monkeypatch.setenv("SPACY_UNMASK_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    path = copy_of(adapter, tmp_path)
    set_tok2vec(path, name=name)
    message = refused(audit, lambda: spacy.load(path), path, words=[FETCH_BASE_ENV])
    assert name not in message


def test_adapter_base_with_another_digest_is_refused(adapter, tmp_path, monkeypatch, audit):
    monkeypatch.setenv(FETCH_BASE_ENV, "1")
    other = save_tiny_model(tmp_path / "other-base", "llama", "metaspace", seed=1)
    path = copy_of(adapter, tmp_path)
    set_tok2vec(path, name=other)
    message = refused(audit, lambda: spacy.load(path), path, other, words=["SHA-256"])
    assert read_backbone(adapter / "ner" / "model")["base"]["sha256"] in message


def test_adapter_pipeline_loads_its_pinned_base_with_the_opt_in(adapter, model_dir, monkeypatch):
    monkeypatch.setenv(FETCH_BASE_ENV, "1")
    nlp = spacy.load(adapter)
    assert nlp(TEXT) is not None
    assert read_backbone(adapter / "ner" / "model")["base"]["revision"] is None


def test_the_audit_hook_sees_what_happens_outside(tmp_path, audit):
    """The recorder the tests above rely on reports an outside read, a write and a socket."""
    import socket

    inside, outside = tmp_path / "inside", tmp_path / "outside.txt"
    inside.mkdir()
    outside.write_text("x")
    with audit:
        outside.read_text()
        (inside / "ok.txt").write_text("fine")
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", 9), timeout=0.1)
    found = audit.outside(inside)
    assert ("open", str(outside.resolve()), False) in found
    assert any(event[0] == "socket.connect" for event in found)
    assert not any(event[0] == "open" and "ok.txt" in event[1] for event in found)
