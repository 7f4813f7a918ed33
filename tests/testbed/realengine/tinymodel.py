"""Build a tiny random-weights but real `Qwen2ForCausalLM` that real vLLM (CPU) serves, shaped like the reference repo.

TEST STAND-IN, not part of the product. Measured: a tiny random-weights Qwen2ForCausalLM
with a byte-level BPE tokenizer trained locally with `tokenizers` and a Hermes-style chat template loads and serves
on vLLM 0.32 CPU (`--tool-call-parser hermes --enable-auto-tool-choice`). This one: hidden 128, intermediate 256,
2 layers, 4 query / 2 KV heads (tensor parallel 2 splits them evenly), vocab 2048, ~0.8 M parameters, bf16.
Everything is local and deterministic: a fixed seed, a fixed training corpus built in this module, single-threaded
tokenizer training; two builds give identical bytes.

The files follow the layout the product's checkpoint code expects (`tests/testbed/hub/checkpoint.py`
builds the synthetic one): six shards `model-0000N-of-00006.safetensors` (5 and 6 in the repo only as `.partNN`
pieces that concatenate back to the shard), `model.safetensors.index.json`, `sha256-manifest.txt`, `reassemble.sh`
and `exl3/plan/J268-ho-v31-K5n.json` (vLLM ignores subdirectories). The two embedding matrices are the biggest
tensors; they go to the parted shards 5 and 6, the rest is dealt round-robin in name order over all six.

Random weights would emit `<|im_end|>` or start a `<tool_call>` now and then; here they never do on their own:
residual channel 0 is a constant that no layer writes to, and `lm_head` weighs it strongly against EOS and, even
more, against every token that starts with `<`. So plain replies (also with `tool_choice: "auto"`) always end with
`finish_reason: "length"`; guided decoding can still force these tokens: a named `tool_choice` ends with "stop",
and `"required"`, once a call is complete, mostly picks EOS over opening another call (ends with "tool_calls").

Runs only under the vLLM venv's interpreter (needs torch, tokenizers, safetensors), from the repo root:

    /tmp/vtry/venv/bin/python -m tests.testbed.realengine.tinymodel --out DIR [--repo-id ID] [--seed S] [--plain DIR]

`<out>/repo/...` holds the repo files and `<out>/standin-index.json` the `RepoInfo` the stand-in Hub serves;
`--plain DIR` also writes a directory vLLM loads directly (six native shards, no parts).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import itertools
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from tests.testbed.hub.checkpoint import (
    GITATTRIBUTES,
    MANIFEST_NAME,
    PARTED_SHARDS,
    PLAN_NAME,
    REASSEMBLE_SH,
    SHARD_COUNT,
    describe_repo,
    plan_document,
    shard_name,
    write_file,
    write_parts,
)
from tests.testbed.hub.repo import FILES_DIR, INDEX_NAME, RepoInfo, save_repo_info

DEFAULT_TINY_REPO_ID = "tb/tiny-qwen2-spark"
DEFAULT_SEED = 0
PART_BYTES = 200 * 1024  # shards 5 and 6 come out as three parts each

HIDDEN = 128
INTERMEDIATE = 256
LAYERS = 2
HEADS = 4  # head_dim 32; 4 query and 2 KV heads split evenly over tensor parallel 2
KV_HEADS = 2
VOCAB_SIZE = 2048
MAX_POSITIONS = 4096
INIT_STD = 0.02
BIAS_CHANNEL = 0  # the constant residual channel behind the logit biases below (see module docstring)
EOS_WEIGHT = -1.0  # about -9 in logits: EOS ~1e-7 per token
ANGLE_WEIGHT = -1.5  # tokens starting with "<": rarer still, so a grammar that allows EOS or "<" picks EOS

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2; skipped when decoding
TOOL_TOKENS = ("<tool_call>", "</tool_call>")  # the last two ids; kept in decoded text for the hermes parser
# Qwen2's pre-tokenizer split (digits one by one). transformers 5 loads any `model_type: qwen2` tokenizer as
# `Qwen2Tokenizer`, which imposes exactly this split whatever tokenizer.json says, so the file must agree with it.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Hermes / Qwen2.5-style ChatML with tools (a raw string: the `\n` escapes are Jinja's).
CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" }}
    {{- "You are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments " }}
    {{- "within <tool_call></tool_call> XML tags:\n<tool_call>\n" }}
    {{- "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first)
        or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

README = f"""---
license: apache-2.0
---
# tiny-qwen2-spark (test stand-in)

A tiny random-weights `Qwen2ForCausalLM` (hidden {HIDDEN}, {LAYERS} layers, vocab {VOCAB_SIZE}) with a locally
trained byte-level BPE tokenizer and a Hermes-style chat template, laid out like the DeepSeek-V4.1-Flash-Spark
checkpoint (six shards, 5 and 6 as `.partNN` pieces). Built by spark-reconciler's tests
(`python -m tests.testbed.realengine.tinymodel`) so a real CPU vLLM has something to serve. Its replies are noise.
"""

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "A reconciler compares the desired state with the observed state and plans the actions that close the gap.",
    "Each node downloads the checkpoint, reassembles the split shards and verifies every file against its hash.",
    "The head node serves the OpenAI compatible API while the worker joins the tensor parallel group.",
    "When the link between the two machines goes down, the engine stops answering and has to be restarted.",
    "Please summarize the following paragraph in one short sentence for the weekly report.",
    "What is the weather like in the city today, and should I take an umbrella with me?",
    "The function returns a list of dictionaries, one for each file that is still missing on the node.",
    "Tokens are generated one at a time; the server streams them to the client as server sent events.",
    "Write a haiku about mountains, rivers, snow and the quiet of an early winter morning.",
    "Translate this sentence into French, German, Spanish and Italian, keeping the tone polite.",
    "The temperature is measured in degrees Celsius and the wind speed in kilometres per hour.",
    "Install the package, create a virtual environment, then run the tests with verbose output enabled.",
    "An error occurred while reading the configuration file: the value of the port is not a number.",
    "Our team meets every Monday morning to review open issues, merged pull requests and the release plan.",
    "She opened the window, looked at the garden and decided to plant tomatoes, beans and sunflowers.",
    "The library provides functions for parsing, validating and serializing structured documents.",
    "If the download is interrupted, the client resumes it from the last byte it received.",
    "Memory usage grows with the length of the context because the attention cache keeps every key and value.",
    "Thank you for your message; I will get back to you as soon as I have checked the logs.",
)

CODE = (
    "def add(a: int, b: int) -> int:\n    return a + b\n",
    "for index, value in enumerate(values):\n    if value is None:\n        continue\n    print(index, value)\n",
    "class Node:\n    def __init__(self, name: str) -> None:\n        self.name = name\n        self.children = []\n",
    "import json\nwith open('config.json') as stream:\n    config = json.load(stream)\n",
    "try:\n    result = compute(data)\nexcept ValueError as error:\n    raise RuntimeError(str(error)) from error\n",
    "async def fetch(session, url):\n    async with session.get(url) as reply:\n        return await reply.text()\n",
    "if __name__ == '__main__':\n    sys.exit(main(sys.argv[1:]))\n",
    "SELECT name, size FROM files WHERE node = 'head' ORDER BY size DESC LIMIT 10;\n",
    "curl -s -H 'Authorization: Bearer key' http://localhost:8000/v1/models\n",
    "docker run --rm --network host -v /models:/model image:latest vllm serve /model\n",
)

CITIES = (
    "Paris", "London", "Berlin", "Tokyo", "Lisbon", "Madrid", "Oslo", "Vienna", "Prague", "Dublin",
    "Rome", "Seoul", "Sydney", "Toronto", "Boston", "Denver", "Cairo", "Lima", "Nairobi", "Warsaw",
)  # fmt: skip

# Common English words: most of the vocabulary (each appears twice, as " word" and "Word").
COMMON_WORDS = """
about above accept access account across action active actual address admit adult affect after again against agent
agree ahead allow almost alone along already also although always among amount analysis animal another answer
anyone anything appear apply approach area argue around arrive article artist assume attack attention audience
author available avoid away baby back balance ball bank base beautiful because become before begin behavior behind
believe benefit best better between beyond big bill billion black blood blue board body book born both box boy
break bring brother budget build building business buyer call camera campaign cancer capital card care career carry
case catch cause cell center central century certain chair challenge chance change character charge check child
choice choose church citizen civil claim class clear close coach cold collection college color common community
company compare computer concern condition conference consider consumer contain continue control cost could country
couple course court cover create crime cultural culture current customer daughter dead deal death debate decade
decide decision deep defense degree democratic describe design despite detail determine develop difference
different difficult dinner direction director discover discuss disease doctor door down draw dream drive drop drug
during each early east easy economic economy edge education effect effort eight either election else employee end
energy enjoy enough enter entire environment especially establish even evening event ever every evidence exactly
example executive exist expect experience expert explain factor fail fall family far fast father fear federal feel
field fight figure fill film final finally financial find fine finger finish fire firm first fish five floor fly
focus follow food foot force foreign forget form former forward four free friend front full fund future game garden
general generation girl give glass goal good government great green ground group grow growth guess hair half hand
hang happen happy hard have head health hear heart heat heavy help here herself high himself history hold home hope
hospital hotel hour house however huge human hundred husband idea identify image imagine impact important improve
include including increase indeed indicate individual industry information inside instead institution interest
interesting international interview investment involve issue item itself join just keep kill kind kitchen know
knowledge land language large last late later laugh lawyer lead leader learn least leave left legal less letter
level life light like likely line list listen little live local long look lose loss love machine magazine main
maintain major majority make manage management manager many market marriage material matter maybe mean measure
media medical meet meeting member memory mention message method middle might military million mind minute miss
mission modern moment money month more most mother mouth move movement movie much music must myself name nation
national natural nature near nearly necessary need network never news newspaper next nice night none north note
nothing notice number occur offer office officer official often once only onto open operation opportunity option
order organization other others outside over owner page pain painting paper parent part participant particular
partner party pass past patient pattern peace people perform performance perhaps period person personal phone
physical pick picture piece place plan plant play player point police policy political poor popular population
position positive possible power practice prepare present president pressure pretty prevent price private probably
problem process produce product production professional professor program project property protect prove provide
public pull purpose push quality question quickly quite race radio raise range rate rather reach read ready real
reality realize really reason receive recent recently recognize record reduce reflect region relate relationship
religious remain remember remove report represent require research resource respond rest result return reveal rich
right rise risk road rock role room rule safe same save scene school science scientist score season seat second
section security seek seem sell send senior sense series serious serve service seven several shake share shoot
short shot should shoulder show side sign significant similar simple simply since sing single sister site
situation size skill skin small smile social society soldier some somebody someone something sometimes song soon
sort sound source south southern space speak special specific speech spend sport spring staff stage stand standard
star start state statement station stay step still stock stop store story strategy street strong structure student
study stuff style subject success successful such suddenly suffer suggest summer support sure surface system table
take talk task teach teacher team technology television tell tend term test than thank their theory there these
they thing think third those though thought thousand threat three through throughout throw thus today together
tonight total tough toward town trade traditional training travel treat treatment tree trial trip trouble true
truth turn type under understand unit until upon used user usually value various very victim view violence visit
voice vote wait walk wall want watch water wear week weight well west western what whatever wheel when where
whether which while white whole whose wide wife will wind window wish with within without woman wonder word work
worker world worry would write writer wrong yard yeah year young yourself
"""


def _module(name: str) -> Any:
    """Import a dependency of the vLLM venv (absent from the project's own venv, hence typed `Any`)."""
    return importlib.import_module(name)


def training_corpus() -> list[str]:
    """The fixed tokenizer training text: prose, code, arithmetic, tool calls and common words."""
    lines = [*SENTENCES, *CODE]
    lines += [f"What is {a} * {b}? {a} * {b} = {a * b}." for a in range(2, 40) for b in range(3, 40, 4)]
    for index, city in enumerate(CITIES):
        call = {"name": "get_weather", "arguments": {"city": city, "unit": "celsius"}}
        lines.append(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")
        lines.append(f"The weather in {city} is {index + 12} degrees with a light wind.")
    words = COMMON_WORDS.split()
    lines += [f"{word.capitalize()} and {other}: the {word} is {other}." for word, other in itertools.pairwise(words)]
    return lines


def train_tokenizer() -> Any:
    """Byte-level BPE trained on `training_corpus()`; ids 0-2 are the special tokens, the tool tokens come last."""
    tokenizers = _module("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.normalizer = tokenizers.normalizers.NFC()
    split = tokenizers.pre_tokenizers.Split(tokenizers.Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False)
    byte_level = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([split, byte_level])
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    tokenizer.post_processor = tokenizers.processors.ByteLevel(trim_offsets=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(TOOL_TOKENS),
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(training_corpus(), trainer=trainer)
    tokenizer.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tokenizer.get_vocab_size()} tokens, expected {VOCAB_SIZE}")
    return tokenizer


def token_ids(tokenizer: Any) -> dict[str, int]:
    return {token: int(tokenizer.token_to_id(token)) for token in (*SPECIAL_TOKENS, *TOOL_TOKENS)}


def config_document(ids: dict[str, int]) -> dict[str, Any]:
    """A Qwen2.5-style `config.json` (the legacy keys both transformers 5 and vLLM read)."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": ids[ENDOFTEXT],
        "eos_token_id": ids[IM_END],
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": INIT_STD,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": MAX_POSITIONS,
        "max_window_layers": LAYERS,
        "model_type": "qwen2",
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB_SIZE,
    }


def generation_config_document(ids: dict[str, int]) -> dict[str, Any]:
    return {
        "bos_token_id": ids[ENDOFTEXT],
        "eos_token_id": [ids[IM_END], ids[ENDOFTEXT]],
        "pad_token_id": ids[ENDOFTEXT],
    }


def _added_token(content: str, *, special: bool) -> dict[str, Any]:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": special,
    }


def tokenizer_config_document(ids: dict[str, int]) -> dict[str, Any]:
    decoder = {str(ids[t]): _added_token(t, special=t in SPECIAL_TOKENS) for t in (*SPECIAL_TOKENS, *TOOL_TOKENS)}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": MAX_POSITIONS,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def special_tokens_map_document() -> dict[str, Any]:
    return {"additional_special_tokens": [IM_START, IM_END], "eos_token": IM_END, "pad_token": ENDOFTEXT}


def tensor_shapes() -> dict[str, tuple[int, ...]]:
    """Every parameter of Qwen2ForCausalLM with these sizes (q/k/v carry biases, o_proj does not)."""
    head_dim = HIDDEN // HEADS
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (VOCAB_SIZE, HIDDEN),
        "model.norm.weight": (HIDDEN,),
        "lm_head.weight": (VOCAB_SIZE, HIDDEN),
    }
    projections = {"q_proj": HEADS * head_dim, "k_proj": KV_HEADS * head_dim, "v_proj": KV_HEADS * head_dim}
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}"
        shapes[f"{prefix}.input_layernorm.weight"] = (HIDDEN,)
        shapes[f"{prefix}.post_attention_layernorm.weight"] = (HIDDEN,)
        for proj, rows in projections.items():
            shapes[f"{prefix}.self_attn.{proj}.weight"] = (rows, HIDDEN)
            shapes[f"{prefix}.self_attn.{proj}.bias"] = (rows,)
        shapes[f"{prefix}.self_attn.o_proj.weight"] = (HIDDEN, HEADS * head_dim)
        shapes[f"{prefix}.mlp.gate_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[f"{prefix}.mlp.up_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[f"{prefix}.mlp.down_proj.weight"] = (HIDDEN, INTERMEDIATE)
    return shapes


def logit_biases(tokenizer: Any) -> dict[int, float]:
    """Token id -> weight on BIAS_CHANNEL: EOS_WEIGHT for the EOS tokens, ANGLE_WEIGHT for tokens starting with "<"."""
    biases = {int(i): ANGLE_WEIGHT for token, i in tokenizer.get_vocab().items() if token.startswith("<")}
    biases.update({int(tokenizer.token_to_id(token)): EOS_WEIGHT for token in (IM_END, ENDOFTEXT)})
    return dict(sorted(biases.items()))


def random_weights(seed: int, biases: dict[int, float]) -> dict[str, Any]:
    """bf16 tensors: norms are ones, everything else N(0, INIT_STD) drawn in sorted-name order from one generator."""
    torch = _module("torch")
    generator = torch.Generator().manual_seed(seed)
    weights: dict[str, Any] = {}
    for name, shape in sorted(tensor_shapes().items()):
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(shape, dtype=torch.float32)
        else:
            weights[name] = torch.randn(shape, generator=generator, dtype=torch.float32) * INIT_STD
    _bias_logits(weights, biases)
    return {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in weights.items()}


def _bias_logits(weights: dict[str, Any], biases: dict[int, float]) -> None:
    """Make BIAS_CHANNEL a constant 1 that no layer writes to, and weigh it into the biased tokens' logits."""
    weights["model.embed_tokens.weight"][:, BIAS_CHANNEL] = 1.0
    for layer in range(LAYERS):
        weights[f"model.layers.{layer}.self_attn.o_proj.weight"][BIAS_CHANNEL, :] = 0.0
        weights[f"model.layers.{layer}.mlp.down_proj.weight"][BIAS_CHANNEL, :] = 0.0
    for token, weight in biases.items():
        weights["lm_head.weight"][token, BIAS_CHANNEL] = weight


def assign_shards(names: list[str]) -> dict[str, str]:
    """Tensor -> shard: the embeddings to the parted shards 5 and 6, the rest round-robin in sorted order."""
    fixed = {"model.embed_tokens.weight": PARTED_SHARDS[0], "lm_head.weight": PARTED_SHARDS[1]}
    rest = sorted(name for name in names if name not in fixed)
    if len(rest) < SHARD_COUNT:
        raise ValueError(f"{len(rest)} tensors cannot fill {SHARD_COUNT} shards")
    assigned = {name: shard_name(n) for name, n in fixed.items()}
    assigned.update({name: shard_name(index % SHARD_COUNT + 1) for index, name in enumerate(rest)})
    return assigned


def shard_payloads(weights: dict[str, Any], weight_map: dict[str, str]) -> dict[str, bytes]:
    """Each shard serialized as safetensors (`{"format": "pt"}` metadata, as transformers writes it)."""
    save = _module("safetensors.torch").save
    shards: dict[str, dict[str, Any]] = {shard_name(n): {} for n in range(1, SHARD_COUNT + 1)}
    for name, shard in weight_map.items():
        shards[shard][name] = weights[name]
    return {shard: bytes(save(tensors, metadata={"format": "pt"})) for shard, tensors in shards.items()}


def _json_text(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def model_files(seed: int) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(metadata files, native shards) by repo path: everything except the shard parts."""
    tokenizer = train_tokenizer()
    ids = token_ids(tokenizer)
    weights = random_weights(seed, logit_biases(tokenizer))
    weight_map = assign_shards(list(weights))
    shards = shard_payloads(weights, weight_map)
    total = sum(int(t.numel()) * int(t.element_size()) for t in weights.values())
    manifest = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in sorted(shards.items()))
    texts = {
        "config.json": _json_text(config_document(ids)),
        "generation_config.json": _json_text(generation_config_document(ids)),
        "tokenizer.json": tokenizer.to_str(pretty=True) + "\n",
        "tokenizer_config.json": _json_text(tokenizer_config_document(ids)),
        "special_tokens_map.json": _json_text(special_tokens_map_document()),
        "chat_template.jinja": CHAT_TEMPLATE,
        "model.safetensors.index.json": _json_text({"metadata": {"total_size": total}, "weight_map": weight_map}),
        MANIFEST_NAME: manifest,
        "reassemble.sh": REASSEMBLE_SH,
        ".gitattributes": GITATTRIBUTES,
        "README.md": README,
        f"exl3/plan/{PLAN_NAME}": _json_text(plan_document()),
    }
    return {path: text.encode() for path, text in texts.items()}, shards


def _write_tree(root: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        write_file(root / path, [data])
    if (root / "reassemble.sh").exists():
        (root / "reassemble.sh").chmod(0o755)


def write_repo(files_dir: Path, metadata: dict[str, bytes], shards: dict[str, bytes]) -> None:
    """The Hub layout: shards 5 and 6 only as `.partNN` pieces of PART_BYTES."""
    parted = {shard_name(n) for n in PARTED_SHARDS}
    _write_tree(files_dir, metadata)
    _write_tree(files_dir, {name: data for name, data in shards.items() if name not in parted})
    for name in sorted(parted):
        write_parts(files_dir / name, [shards[name]], PART_BYTES)


def write_plain(plain: Path, metadata: dict[str, bytes], shards: dict[str, bytes]) -> None:
    """A directory `vllm serve` loads as is: the same files with all six native shards."""
    plain.mkdir(parents=True, exist_ok=True)
    _write_tree(plain, {**metadata, **shards})


def build_tiny_checkpoint(
    out: Path, repo_id: str = DEFAULT_TINY_REPO_ID, seed: int = DEFAULT_SEED, plain: Path | None = None
) -> RepoInfo:
    """Write the repo under `out/repo`, its index to `out/standin-index.json` (and `plain`); return its `RepoInfo`.

    Rebuilding replaces `out/repo` and the index (nothing else in `out` is touched); `plain` is overwritten in place.
    """
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # single-threaded BPE training; set before tokenizers loads
    metadata, shards = model_files(seed)
    files_dir = out / FILES_DIR
    if files_dir.exists():
        shutil.rmtree(files_dir)
    (out / INDEX_NAME).unlink(missing_ok=True)
    files_dir.mkdir(parents=True)
    write_repo(files_dir, metadata, shards)
    if plain is not None:
        write_plain(plain, metadata, shards)
    info = describe_repo(repo_id, files_dir)
    save_repo_info(out, info)
    return info


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.testbed.realengine.tinymodel",
        description="build a tiny real Qwen2 checkpoint for a CPU vLLM (test stand-in)",
    )
    parser.add_argument("--out", type=Path, required=True, help="writes OUT/repo and OUT/standin-index.json")
    parser.add_argument("--repo-id", default=DEFAULT_TINY_REPO_ID)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--plain", type=Path, help="also write an unsplit model directory for `vllm serve`")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    info = build_tiny_checkpoint(args.out, repo_id=args.repo_id, seed=args.seed, plain=args.plain)
    plain = f" plain={args.plain}" if args.plain is not None else ""
    print(
        f"built {info.repo_id} commit={info.commit} files={len(info.files)} bytes={info.total_size()} "
        f"in {args.out}{plain}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
