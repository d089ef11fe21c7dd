#!/usr/bin/env python3
"""A reference implementation of an `hla export` in NumPy, written from the export alone.

It reads every fact from the export's config.json (tensor names, shapes, epsilons, the
decay of each head, the order of operations; the format: docs/export.md),
loads model.safetensors and runs the model token by token with the serial recurrence
(a KV cache for softmax attention), in float64. Each layer has its own mixer in a hybrid
stack (version 2); a version 1 export has one mixer for every layer.

    python3 hla_reference.py EXPORT generate --prompt "ROMEO:" --max-tokens 100
    python3 hla_reference.py EXPORT eval --corpus input.txt [--json]

`generate` is greedy (`hla generate --temperature 0`); `eval` is the validation loss of
`hla eval` on a text corpus. Needs numpy and safetensors; char and byte tokenizers only.
"""

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

FORMAT, VERSIONS = "hla-export", (1, 2)


def silu(x):
    return x / (1.0 + np.exp(-x))


def log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


_erf = np.vectorize(math.erf)


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


class Tokenizer:
    """The export's tokenizer.json: `char` (a sorted character list) or `byte`."""

    def __init__(self, path):
        saved = json.loads(Path(path).read_text())
        self.kind = saved["kind"]
        if self.kind == "char":
            # A corpus of several documents adds end-of-text after the characters.
            self.chars = list(saved["chars"])
            if saved.get("end_of_text", False):
                self.chars.append("<|endoftext|>")
            self.index = {c: i for i, c in enumerate(self.chars)}
        elif self.kind != "byte":
            sys.exit(f"the reference handles char and byte tokenizers, not {self.kind}")

    def encode(self, text):
        if self.kind == "byte":
            return list(text.encode("utf-8"))
        return [self.index[c] for c in text]

    def decode(self, ids):
        if self.kind == "byte":
            parts, part = [], []
            for i in ids + [256]:  # 256: end-of-text, present with several documents
                if i == 256:
                    parts.append(bytes(part).decode("utf-8", errors="replace"))
                    part = []
                else:
                    part.append(i)
            return "<|endoftext|>".join(parts)
        return "".join(self.chars[i] for i in ids)


class Model:
    def __init__(self, folder):
        folder = Path(folder)
        self.config = json.loads((folder / "config.json").read_text())
        if self.config.get("format") != FORMAT or self.config.get("version") not in VERSIONS:
            sys.exit(f"{folder} is not an {FORMAT} export of version {VERSIONS}")
        self.arch = self.config["architecture"]
        # Version 1 has no `mixers`: its one `mixer` describes every layer.
        self.mixers = self.arch.get("mixers") or [self.arch["mixer"]] * self.arch["layers"]
        self.weights = {
            name: tensor.astype(np.float64)
            for name, tensor in load_file(folder / "model.safetensors").items()
        }

    def tensor(self, name, layer=None):
        return self.weights[name.replace("{i}", str(layer))]

    def norm(self, x, names, layer=None):
        norm, gamma = self.arch["norm"], self.tensor(names["gamma"], layer)
        eps = norm["epsilon"]
        if norm["kind"] == "rms":
            return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * gamma
        centred = x - x.mean(-1, keepdims=True)
        return centred / np.sqrt(np.mean(centred**2, -1, keepdims=True) + eps) * gamma

    def init_state(self, batch):
        return {"t": 0, "batch": batch, "layers": [{} for _ in range(self.arch["layers"])]}

    def step(self, tokens, state):
        """`tokens [batch]` (ints) -> next-token logits `[batch, vocab]`."""
        x = self.tensor(self.arch["embedding"]["weight"])[tokens]
        positions = self.arch["positions"]
        if positions["kind"] == "learned":
            x = x + self.tensor(positions["weight"])[state["t"]]
        for layer, memory in enumerate(state["layers"]):
            m = self.mixers[layer]
            x = x + self.mix(self.norm(x, m["norm"], layer), m, memory, layer, state["t"])
            mlp = self.arch["mlp"]
            if mlp is not None:
                x = x + self.feed_forward(self.norm(x, mlp["norm"], layer), mlp, layer)
        state["t"] += 1
        x = self.norm(x, self.arch["final_norm"])
        head = self.arch["head"]
        if head["tied"]:
            return x @ self.tensor(self.arch["embedding"]["weight"]).T
        return x @ self.tensor(head["weight"])

    def feed_forward(self, x, mlp, layer):
        if mlp["kind"] == "swiglu":
            hidden = silu(x @ self.tensor(mlp["w1"]["weight"], layer)) * (
                x @ self.tensor(mlp["w2"]["weight"], layer)
            )
        else:
            hidden = gelu(x @ self.tensor(mlp["w"]["weight"], layer))
        return hidden @ self.tensor(mlp["down"]["weight"], layer)

    def mix(self, x, m, memory, layer, t):
        q, k, v = (x @ self.tensor(m[name]["weight"], layer) for name in ("q", "k", "v"))
        if m["short_conv"] is not None:
            conv = self.tensor(m["short_conv"]["weight"], layer)
            qkv = np.concatenate([q, k, v], -1)
            history = memory.get("conv", np.zeros((len(x), conv.shape[0] - 1, qkv.shape[1])))
            window = np.concatenate([history, qkv[:, None]], 1)
            memory["conv"] = window[:, 1:]
            y = silu((window * conv[None]).sum(1))
            q, k, v = np.split(y, [q.shape[1], q.shape[1] + k.shape[1]], -1)
        batch, heads, d_head = len(x), m["heads"], m["d_head"]
        q = q.reshape(batch, heads, d_head)
        k = np.broadcast_to(k.reshape(batch, -1, d_head), q.shape)
        v = v.reshape(batch, heads, d_head)
        if m["kind"] == "softmax":
            o = self.attend(q, k, v, m, memory, t)
        else:
            o = self.recur(x, q, k, v, m, memory, layer)
        o = o.reshape(batch, heads * d_head)
        if m["output_gate"] is not None:
            o = o * silu(x @ self.tensor(m["output_gate"]["weight"], layer))
        return o @ self.tensor(m["out"]["weight"], layer)

    def attend(self, q, k, v, m, memory, t):
        rope = m["rope"]
        if rope is not None:
            q, k = turn(q, t, rope["base"]), turn(k, t, rope["base"])
        empty = np.zeros(q.shape[:2] + (0, q.shape[2]))
        keys = memory["k"] = np.concatenate([memory.get("k", empty), k[:, :, None]], 2)
        values = memory["v"] = np.concatenate([memory.get("v", empty), v[:, :, None]], 2)
        scores = np.einsum("bhd,bhjd->bhj", q, keys) / math.sqrt(q.shape[-1])
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        return np.einsum("bhj,bhjd->bhd", weights, values)

    def recur(self, x, q, k, v, m, memory, layer):
        q, k = feature_map(m["feature_map"], q, True), feature_map(m["feature_map"], k, False)
        g = self.gates(x, m, layer)[:, :, None, None]
        if m["denominator"] is not None:
            v = np.concatenate([v, np.ones(v.shape[:-1] + (1,))], -1)
        d, dv = q.shape[-1], v.shape[-1]
        zeros = lambda rows, cols: np.zeros(q.shape[:2] + (rows, cols))
        outer = lambda a, b: a[..., :, None] * b[..., None, :]
        read = lambda a, state: np.einsum("bhd,bhde->bhe", a, state)
        s = lambda: memory.get("S", zeros(d, d))
        kind = m["kind"]
        if kind == "linear":
            memory["S"] = g * memory.get("S", zeros(d, dv)) + outer(k, v)
            o = read(q, memory["S"])
        elif kind == "hla2":
            memory["S"] = g * s() + outer(k, k)
            s_q = read(q, memory["S"])  # S is symmetric: S q = q^T S
            memory["Z"] = g**2 * memory.get("Z", zeros(d, dv)) + outer(s_q, v)
            o = read(q, memory["Z"])
        elif kind == "hla3":
            memory["S"] = g * s() + outer(k, k)
            memory["P"] = g * memory.get("P", zeros(d, dv)) + outer(k, v)
            s_q = read(q, memory["S"])
            memory["Y"] = g**3 * memory.get("Y", zeros(d, dv)) + outer(s_q, read(q, memory["P"]))
            o = read(q, memory["Y"])
        elif kind == "ahla":
            memory["P"] = g * memory.get("P", zeros(d, dv)) + outer(k, v)
            memory["E"] = g * memory.get("E", zeros(d, dv)) + outer(k, read(q, memory["P"]))
            o = read(q, memory["E"])
        else:
            sys.exit(f"unknown mixer {kind}")
        if m["denominator"] is not None:
            den = o[..., -1:]
            clamped = np.maximum(np.abs(den), m["denominator"]["epsilon"])
            o = o[..., :-1] / np.where(den < 0, -clamped, clamped)
        norm = m["output_norm"]
        if norm is not None:
            gamma = self.tensor(norm["gamma"], layer)
            o = o / np.sqrt(np.mean(o * o, -1, keepdims=True) + norm["epsilon"]) * gamma
        return o

    def gates(self, x, m, layer):
        """`g_t` of every head, `[batch, heads]`, in a layer with mixer `m`."""
        decay, heads = m["decay"], m["heads"]
        if decay["kind"] == "none":
            return np.ones((len(x), heads))
        if decay["kind"] == "fixed":
            return np.broadcast_to(np.array(decay["gamma"]), (len(x), heads))
        logits = x @ self.tensor(decay["weight"], layer)
        return np.exp(log_sigmoid(logits) / decay["temperature"])


def turn(x, t, base):
    """RoPE at position t: pairs (2i, 2i+1) turn by t * base^(-2i/d)."""
    d = x.shape[-1]
    angle = t * base ** (-np.arange(0, d, 2) / d)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * np.cos(angle) - b * np.sin(angle)
    out[..., 1::2] = a * np.sin(angle) + b * np.cos(angle)
    return out


def feature_map(spec, x, query):
    kind = spec["kind"]
    if kind == "l2":
        return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), spec["epsilon"])
    if kind == "elu_plus_one":
        return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    if kind == "scale" and query:
        return x / math.sqrt(x.shape[-1])
    return x


def log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def generate(model, tokenizer, prompt, max_tokens):
    """Greedy: the prompt, then `max_tokens` argmax tokens."""
    state = model.init_state(1)
    for token in tokenizer.encode(prompt):
        logits = model.step(np.array([token]), state)
    out = []
    for _ in range(max_tokens):
        out.append(int(np.argmax(logits[0])))
        logits = model.step(np.array(out[-1:]), state)
    return prompt + tokenizer.decode(out)


def evaluate(model, tokenizer, text):
    """Mean cross-entropy over the validation split, windowed as config.json says."""
    spec = model.config["evaluation"]
    if spec["task"] != "text":
        sys.exit("the reference evaluates text runs only")
    tokens = np.array(tokenizer.encode(text))
    split = tokens[int(len(tokens) * spec["train_fraction"]) :]
    context = spec["context"]
    windows = [split[s : s + context + 1] for s in range(0, len(split) - 1, context)]
    total, count = 0.0, 0
    for length in sorted({len(w) for w in windows}):
        batch = np.stack([w for w in windows if len(w) == length])
        state = model.init_state(len(batch))
        for t in range(length - 1):
            log_p = log_softmax(model.step(batch[:, t], state))
            total -= log_p[np.arange(len(batch)), batch[:, t + 1]].sum()
            count += len(batch)
    return total / count, count


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", help="the folder hla export wrote")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="greedy text after a prompt")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-tokens", type=int, default=200)
    ev = commands.add_parser("eval", help="validation loss on a text corpus")
    ev.add_argument("--corpus", required=True, help="the text file the run trained on")
    ev.add_argument("--json", action="store_true")
    args = parser.parse_args()

    model = Model(args.export)
    tokenizer = Tokenizer(Path(args.export) / "tokenizer.json")
    if args.command == "generate":
        print(generate(model, tokenizer, args.prompt, args.max_tokens))
    else:
        loss, tokens = evaluate(model, tokenizer, Path(args.corpus).read_text())
        if args.json:
            print(json.dumps({"loss": loss, "tokens": tokens}))
        else:
            print(f"validation: loss {loss:.6f} ({tokens} tokens)")


if __name__ == "__main__":
    main()
