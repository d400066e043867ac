"""A mixed text set for parity tests: short, long past the max length, unicode, emoji,
whitespace, code, numbers. Deterministic."""

from __future__ import annotations

import random

_WORDS = (
    "retrieval embedding vector search rerank query document passage model serve batch token "
    "latency throughput index corpus answer question context window cosine similarity dense "
    "sparse hybrid chunk semantic lexical score relevance cluster label classify sentiment"
).split()

FIXED = [
    "hello",
    "Hello, world!",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "   leading and trailing whitespace   ",
    "tabs\tand\nnewlines\r\nmixed in",
    "     ",
    "ünïcödé tëxt wïth äccents",
    "日本語のテキストも埋め込めます。",
    "中文文本嵌入测试",
    "Русский текст для проверки",
    "العربية نص للاختبار",
    "emoji 🙂🚀🔥 in a sentence 👍🏽",
    "🙂",
    "def f(x):\n    return x ** 2  # code",
    "SELECT * FROM docs WHERE id = 42;",
    "3.14159 2.71828 1.41421 42 1e-9",
    "a",
    "A" * 300,
    "The quick brown fox jumps over the lazy dog. " * 60,  # far past 256 tokens
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "https://example.com/path?query=1&b=2#frag",
    "email@example.com and @handles #hashtags",
    "MiXeD CaSe TeXt",
    "newline\n\n\nparagraphs\n\nhere",
]


def mixed_texts(count: int = 60, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    texts = list(FIXED)
    while len(texts) < count:
        n = rng.choice([3, 8, 20, 60, 150, 400])
        texts.append(" ".join(rng.choice(_WORDS) for _ in range(n)))
    return texts
