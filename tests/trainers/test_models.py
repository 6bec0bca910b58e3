"""Policy sources, loading, LoRA and saving: on the tiny model, and once on the embedded GGUF."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch (the 'train' extra) is not installed")
transformers = pytest.importorskip("transformers", reason="transformers (the 'train' extra) is not installed")
peft = pytest.importorskip("peft", reason="peft (the 'train' extra) is not installed")

from factory.errors import ConfigError, ModelConfigError  # noqa: E402
from factory.models import DEFAULT_WEIGHTS  # noqa: E402
from factory.trainers import (  # noqa: E402
    PolicySource,
    apply_lora,
    load_policy,
    resolve_policy,
    save_policy,
)

CHAT = [{"role": "user", "content": "What is 17 + 25?"}, {"role": "assistant", "content": "Final: 42"}]
QUANTIZER_ATTRS = ("hf_quantizer", "quantization_method")


def copy_model(tiny_model: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_model, tmp_path / "copy"))


def lora_step(model, tokenizer, lr: float = 1e-2) -> None:
    """One manual AdamW step on the chat, adapter weights only."""
    batch = tokenizer.apply_chat_template(CHAT, return_tensors="pt", return_dict=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    loss = model(**batch, labels=batch["input_ids"]).loss
    assert torch.isfinite(loss)
    loss.backward()
    optimizer.step()


def lora_targets(model) -> set[str]:
    """Weight names, in the unwrapped model, of the linear layers LoRA adapted."""
    return {name.replace("base_model.model.", "", 1).replace(".base_layer", "") + ".weight"
            for name, module in model.named_modules() if isinstance(module, peft.tuners.lora.LoraLayer)}


def generate_text(model, tokenizer, tokens: int = 4) -> str:
    prompt = tokenizer.apply_chat_template(CHAT[:1], add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    output = model.generate(**prompt, max_new_tokens=tokens, do_sample=False)
    assert output.shape[1] > prompt["input_ids"].shape[1]
    return tokenizer.decode(output[0, prompt["input_ids"].shape[1]:])


# --- resolve_policy -------------------------------------------------------------------------------------------


def test_importing_the_module_imports_no_torch():
    code = "import sys, factory.trainers._models; sys.exit('torch' in sys.modules or 'transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_resolve_folder(tiny_model):
    source = resolve_policy(tiny_model)
    assert source == PolicySource(spec=tiny_model, kind="folder", path=str(Path(tiny_model).resolve()), sha256=None)
    assert source.to_dict() == {"spec": tiny_model, "kind": "folder", "path": source.path, "sha256": None}
    json.dumps(source.to_dict())


def test_resolve_hf_prefix_is_the_fork_spelling_of_a_folder(tiny_model):
    source = resolve_policy(f"hf:{tiny_model}")
    assert (source.kind, source.path, source.spec) == ("folder", resolve_policy(tiny_model).path, f"hf:{tiny_model}")


def test_resolve_relative_folder(tiny_model, monkeypatch):
    monkeypatch.chdir(Path(tiny_model).parent)
    source = resolve_policy(f"./{Path(tiny_model).name}")
    assert source.path == str(Path(tiny_model).resolve())


@pytest.mark.parametrize("spec", ["./no/such/model", "/no/such/model", "~/no-such-model-here", "hf:./missing",
                                  "missing.gguf", "local:/no/such/model.gguf", "gguf:missing.gguf", "hf:", "gpt2"])
def test_resolve_missing_path_is_a_config_error(spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        resolve_policy(spec)
    assert info.value.exit_code == 2


def test_resolve_folder_without_config_is_refused_by_name(tmp_path):
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match="not-a-model.*config.json"):
        resolve_policy(str(folder))


def test_resolve_a_file_that_is_not_gguf_is_refused(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"x")
    with pytest.raises(ConfigError, match="model.bin"):
        resolve_policy(str(tmp_path / "model.bin"))


@pytest.mark.parametrize("spec", ["Qwen/Qwen2.5-0.5B-Instruct", "hf:Qwen/Qwen2.5-0.5B-Instruct"])
def test_resolve_hub_id(spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_policy(spec) == PolicySource(spec=spec, kind="hub", path="Qwen/Qwen2.5-0.5B-Instruct")


def test_an_existing_folder_wins_over_a_hub_id(tiny_model, tmp_path, monkeypatch):
    shutil.copytree(tiny_model, tmp_path / "owner" / "name")
    monkeypatch.chdir(tmp_path)
    assert resolve_policy("owner/name").kind == "folder"


@pytest.mark.parametrize("prefix", ["", "local:", "gguf:"])
def test_resolve_gguf_file_records_its_digest(prefix, tmp_path):
    path = tmp_path / "policy.gguf"
    path.write_bytes(b"GGUF not really, resolving does not read the model")
    source = resolve_policy(prefix + str(path))
    assert source.kind == "gguf"
    assert source.path == str(path.resolve())
    assert source.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("spec", ["local", "local:", "gguf:default"])
def test_resolve_local_is_the_embedded_gguf(spec, isolated_home):
    try:
        source = resolve_policy(spec)
    except ModelConfigError as exc:
        pytest.skip(f"embedded weights not installed: {exc}")
    assert source.kind == "gguf" and source.sha256 == DEFAULT_WEIGHTS.sha256
    assert Path(source.path).is_file() and Path(source.path).name == DEFAULT_WEIGHTS.filename
    assert Path(source.path).is_relative_to(isolated_home)  # joined under FACTORY_HOME, nowhere else


# --- load_policy ----------------------------------------------------------------------------------------------


def test_load_tiny_model(tiny_model, one_torch_thread):
    model, tokenizer = load_policy(resolve_policy(tiny_model))
    assert isinstance(model, transformers.PreTrainedModel) and model.can_generate()
    assert model.dtype == torch.float32  # the CPU default
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert tokenizer.pad_token == "<|endoftext|>"  # the checkpoint's own, kept
    assert not any(hasattr(model, attr) for attr in QUANTIZER_ATTRS)


@pytest.mark.parametrize(("dtype", "expected"),
                         [("bf16", "bfloat16"), ("float16", "float16"), ("torch.float32", "float32")])
def test_load_in_a_chosen_dtype(tiny_model, one_torch_thread, dtype, expected):
    model, _ = load_policy(resolve_policy(tiny_model), dtype=dtype)
    assert model.dtype == getattr(torch, expected)


def test_load_unknown_dtype_is_a_config_error(tiny_model):
    with pytest.raises(ConfigError, match="int8"):
        load_policy(resolve_policy(tiny_model), dtype="int8")


def test_load_without_pad_token_pads_with_eos(tiny_model, tmp_path, one_torch_thread):
    folder = copy_model(tiny_model, tmp_path)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings["pad_token"] = None
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    _, tokenizer = load_policy(resolve_policy(str(folder)))
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"


def test_load_without_chat_template_is_refused(tiny_model, tmp_path):
    folder = copy_model(tiny_model, tmp_path)
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(ConfigError, match="chat template"):
        load_policy(resolve_policy(str(folder)))


def test_load_a_broken_checkpoint_is_a_config_error(tiny_model, tmp_path):
    folder = copy_model(tiny_model, tmp_path)
    (folder / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ConfigError, match="cannot load policy"):
        load_policy(resolve_policy(str(folder)))


# --- apply_lora and save_policy -------------------------------------------------------------------------------


def test_lora_step_then_save_adapter_and_merged(tiny_model, tmp_path, one_torch_thread):
    base_model, tokenizer = load_policy(resolve_policy(tiny_model))
    base = {name: tensor.clone() for name, tensor in base_model.state_dict().items()}
    model = apply_lora(base_model, r=4, alpha=8)
    assert isinstance(model, peft.PeftModel)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    targets = lora_targets(model)
    assert any("q_proj" in t for t in targets) and any("down_proj" in t for t in targets)  # all-linear
    assert not any("lm_head" in t or "embed" in t for t in targets)
    before = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}

    lora_step(model, tokenizer)
    changed = [name for name, p in model.named_parameters() if name in before and not torch.equal(p, before[name])]
    assert any("lora_B" in name for name in changed)  # lora_B starts at zero: only a step moves it

    paths = save_policy(model, tokenizer, tmp_path / "run")
    assert paths == {"adapter": str(tmp_path / "run" / "adapter"), "model": str(tmp_path / "run" / "model")}
    adapter = Path(paths["adapter"])
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {p.name for p in adapter.iterdir()}
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4

    merged_dir = Path(paths["model"])
    assert (merged_dir / "model.safetensors").is_file() and (merged_dir / "generation_config.json").is_file()
    merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir)
    reloaded_tokenizer = transformers.AutoTokenizer.from_pretrained(merged_dir)
    assert merged.config.use_cache is True
    weights = merged.state_dict()
    assert not any("lora" in name for name in weights)
    for name, tensor in base.items():
        if name in targets:
            assert not torch.equal(weights[name], tensor), f"{name}: LoRA's update was not merged"
        else:
            assert torch.equal(weights[name], tensor), f"{name}: changed although LoRA did not touch it"
    assert reloaded_tokenizer.apply_chat_template(CHAT, tokenize=False) == tokenizer.apply_chat_template(
        CHAT, tokenize=False)
    generate_text(merged, reloaded_tokenizer)

    from peft import PeftModel
    # The adapter alone, on the base it was trained from, gives the merged model's logits.
    base_again, _ = load_policy(resolve_policy(tiny_model))
    with_adapter = PeftModel.from_pretrained(base_again, adapter).eval()
    batch = tokenizer.apply_chat_template(CHAT, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        torch.testing.assert_close(with_adapter(**batch).logits, merged.eval()(**batch).logits, rtol=1e-4, atol=1e-4)


def test_save_lora_without_merge_writes_only_the_adapter(tiny_model, tmp_path, one_torch_thread):
    model, tokenizer = load_policy(resolve_policy(tiny_model))
    paths = save_policy(apply_lora(model), tokenizer, tmp_path / "run", merge=False)
    assert paths == {"adapter": str(tmp_path / "run" / "adapter")}
    assert not (tmp_path / "run" / "model").exists()


def test_save_a_plain_model_writes_only_the_full_checkpoint(tiny_model, tmp_path, one_torch_thread):
    model, tokenizer = load_policy(resolve_policy(tiny_model))
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)  # stands in for training: the saved weights must be these
    model.config.use_cache = False  # as training leaves it
    paths = save_policy(model, tokenizer, tmp_path / "run")
    assert paths == {"model": str(tmp_path / "run" / "model")}
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["model"]
    assert model.config.use_cache is False  # the caller's model is left as it was
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(paths["model"])
    assert reloaded.config.use_cache is True
    assert torch.equal(reloaded.model.norm.weight, model.model.norm.weight)
    generate_text(reloaded, transformers.AutoTokenizer.from_pretrained(paths["model"]))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"r": 0}, "rank"), ({"alpha": 0}, "alpha"), ({"dropout": 1.0}, "dropout"),
    ({"target_modules": ["no_such_proj"]}, "no_such_proj"),
])
def test_apply_lora_bad_settings_are_config_errors(tiny_model, kwargs, message):
    model, _ = load_policy(resolve_policy(tiny_model))
    with pytest.raises(ConfigError, match=message):
        apply_lora(model, **kwargs)


def test_apply_lora_twice_is_refused(tiny_model):
    model, _ = load_policy(resolve_policy(tiny_model))
    with pytest.raises(ConfigError, match="already"):
        apply_lora(apply_lora(model))


def test_apply_lora_to_named_modules(tiny_model):
    model, _ = load_policy(resolve_policy(tiny_model))
    targets = lora_targets(apply_lora(model, target_modules=["q_proj", "v_proj"]))
    assert targets and all(name.endswith(("q_proj.weight", "v_proj.weight")) for name in targets)


# --- the embedded GGUF ----------------------------------------------------------------------------------------


def write_tiny_gguf(folder: Path, out: Path) -> Path:
    """A qwen2 GGUF file of the tiny model in ``folder``, as llama.cpp's converter lays one out: its weight matrices
    quantized to Q8_0 (so loading dequantizes them, as for the embedded model), its byte-level BPE vocabulary and
    merges, and its chat template in the file's metadata."""
    gguf = pytest.importorskip("gguf", reason="gguf (the 'train' extra) is not installed")
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    vocabulary = json.loads((folder / "tokenizer.json").read_text())
    writer = gguf.GGUFWriter(str(out), "qwen2")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    added = {token["content"]: token["id"] for token in vocabulary.get("added_tokens", [])}
    tokens = [""] * config["vocab_size"]
    for token, index in {**vocabulary["model"]["vocab"], **added}.items():
        tokens[index] = token
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in added else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in vocabulary["model"]["merges"]])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_chat_template((folder / "chat_template.jinja").read_text())
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    parts = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for key, tensor in load_file(folder / "model.safetensors").items():
        if key in names:
            name = names[key]
        else:  # model.layers.N.<module>.<weight|bias>
            _, _, block, rest = key.split(".", 3)
            module, _, kind = rest.rpartition(".")
            name = f"blk.{block}.{parts[module]}.{kind}"
        value = tensor.float().numpy()
        if value.ndim == 2:
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quantize(value, q8), raw_dtype=q8)
        else:
            writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    from factory.trainers import build_tiny_model

    folder = build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), arch="qwen2")
    return write_tiny_gguf(folder, tmp_path_factory.mktemp("gguf") / "tiny-q8_0.gguf")


def test_a_gguf_policy_trains_with_lora_and_saves_a_loadable_checkpoint(tiny_gguf, tmp_path, one_torch_thread):
    """The GGUF path of the embedded model, on a tiny quantized GGUF file: seconds instead of a minute and a half."""
    source = resolve_policy(str(tiny_gguf))
    assert source.kind == "gguf" and source.sha256 == hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    # a random tiny model may well say only newlines: generate_text checks that it said something
    gguf_trains_with_lora_and_saves_a_loadable_checkpoint(source, tmp_path)


@pytest.mark.slow
def test_embedded_gguf_trains_with_lora_and_saves_a_loadable_checkpoint(tmp_path, one_torch_thread):
    """~60-95 s on two cores: reading the embedded GGUF (tokenizer and weights, dequantized) takes most of it."""
    pytest.importorskip("gguf", reason="gguf (the 'train' extra) is not installed")
    try:
        source = resolve_policy("local")
    except ModelConfigError as exc:
        pytest.skip(f"embedded weights not installed: {exc}")
    assert gguf_trains_with_lora_and_saves_a_loadable_checkpoint(source, tmp_path).strip()


def gguf_trains_with_lora_and_saves_a_loadable_checkpoint(source: PolicySource, tmp_path: Path) -> str:
    """Load ``source`` dense, LoRA-train a step, save merged, reload: the reloaded model's greedy text."""
    model, tokenizer = load_policy(source)
    # Dense weights, and no quantizer left behind for Trainer or save_pretrained to refuse.
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not any(hasattr(model, attr) for attr in QUANTIZER_ATTRS) and not model.is_quantized
    assert "quantization_config" not in model.config.to_dict()
    assert "<|im_start|>assistant\n" in tokenizer.apply_chat_template(CHAT[:1], tokenize=False,
                                                                       add_generation_prompt=True)
    assert tokenizer.pad_token is not None
    # Trainer accepts it for full fine-tuning (it refuses a model still marked as GGUF-quantized).
    args = transformers.TrainingArguments(str(tmp_path / "trainer"), use_cpu=True, report_to="none")
    transformers.Trainer(model=model, args=args)

    target = "model.layers.0.self_attn.q_proj.weight"
    original = model.state_dict()[target].clone()
    model = apply_lora(model, r=4, alpha=8)
    lora_step(model, tokenizer)
    paths = save_policy(model, tokenizer, tmp_path / "run")
    del model

    merged = transformers.AutoModelForCausalLM.from_pretrained(paths["model"])
    config = json.loads((Path(paths["model"]) / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "qwen2"
    assert not torch.equal(merged.state_dict()[target], original)
    return generate_text(merged, transformers.AutoTokenizer.from_pretrained(paths["model"]))
