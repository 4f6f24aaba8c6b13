"""Write the fictional-atlas corpus and its questions for the `search` environment (lmrl/envs/search.py).

Every entity (country, city, river, person, invention) has an invented name and invented attributes,
so a model cannot know the answers without searching. Names are unique across the whole atlas, each
fact is stated in exactly one passage, and each question names one entity, so its gold answer is
unambiguous; the script checks this before writing. Single-hop questions are answered by one passage;
two-hop questions need a second passage found through the first. Deterministic: the same seed writes
byte-identical files.

    .venv/bin/python scripts/make_search_corpus.py             # writes src/lmrl/envs/corpus/
    .venv/bin/python scripts/make_search_corpus.py --out /tmp/atlas
"""
from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

SEED = 2718
NAME = "fictional_atlas"
OUT = Path(__file__).resolve().parents[1] / "src" / "lmrl" / "envs" / "corpus"

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr", "st",
          "th", "tr", "sk", "vel", "mor"]
VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ae", "ia"]
CODAS = ["", "n", "r", "l", "s", "th", "m", "x", "k", "nd", "rd"]
KINDS = ["republic", "kingdom", "principality", "federation", "duchy"]
PARTS = ["northern", "southern", "eastern", "western", "central"]
ANIMALS = ["snow leopard", "marsh heron", "red deer", "silver fox", "mountain goat", "grey owl", "river otter",
           "black swan", "wild boar", "golden eagle", "sea turtle", "brown bear"]
LANDMARKS = ["Bridge", "Tower", "Library", "Gate", "Market", "Observatory", "Cathedral", "Lighthouse"]
PROFESSIONS = ["cartographer", "engineer", "composer", "astronomer", "glassblower", "botanist", "clockmaker",
               "poet", "physician", "shipwright", "weaver", "architect"]
TOPICS = ["tidal charts", "bell casting", "star catalogues", "dye recipes", "river surveys", "field hymns",
          "seed banks", "harbour walls", "winter calendars", "canal locks"]
DEVICES = {"loom": "weaving sailcloth", "engine": "pumping water from mines", "lamp": "lighting mine shafts",
           "compass": "navigating in fog", "press": "printing maps", "clock": "keeping time at sea",
           "kiln": "firing roof tiles", "telescope": "watching comets", "valve": "regulating steam boilers",
           "sextant": "measuring the height of stars"}
MATERIALS = ["brass", "oak", "glass", "copper", "iron", "bone", "slate", "silver", "bronze", "cedar"]
TEMPLATE_WORDS = ("is a in the part of its capital and official language was founded currency national animal "
                  "highest mountain mount which rises metres city on river it best known landmark flows through "
                  "for kilometres empties into lake born studied under remembered work invented by built used "
                  "an he she his her hills what who where when how high long year lies teacher inventor country")
RESERVED = set(re.findall(r"[a-z]+", " ".join([TEMPLATE_WORDS, *KINDS, *PARTS, *ANIMALS, *PROFESSIONS, *TOPICS,
                                                *DEVICES, *DEVICES.values(), *MATERIALS]).lower()))


class Names:
    """Invented names, unique across the atlas and distinct from every word the templates use."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def __call__(self, syllables: int = 2, suffix: str = "") -> str:
        while True:
            stem = "".join(self.rng.choice(ONSETS) + self.rng.choice(VOWELS) for _ in range(syllables))
            word = (stem + self.rng.choice(CODAS) + suffix).capitalize()
            if len(word) >= 5 and word.lower() not in self.used and word.lower() not in RESERVED:
                self.used.add(word.lower())
                return word


def build_atlas(seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """(passages, questions): the corpus rows {id, title, text} and the QA rows {uid, question, answer,
    support, hops}, `support` being the ids of the passages that answer it (in reading order)."""
    rng = random.Random(seed)
    name = Names(rng)
    passages: list[dict] = []

    def passage(title: str, text: str) -> str:
        pid = f"atlas-{len(passages):04d}"
        passages.append({"id": pid, "title": title, "text": text})
        return pid

    continents = [name(3) for _ in range(4)]
    countries, cities, rivers, people, inventions = [], [], [], [], []
    for _ in range(24):
        c = {"name": name(rng.choice([1, 2])), "kind": rng.choice(KINDS), "part": rng.choice(PARTS),
             "continent": rng.choice(continents), "language": name(2, rng.choice(["ic", "ish", "ese", "an"])),
             "founded": str(rng.randint(880, 1850)), "currency": name(2).lower(), "animal": rng.choice(ANIMALS),
             "mountain": f"Mount {name(2)}", "height": str(rng.randint(1800, 6400))}
        countries.append(c)
        for _ in range(2):
            rivers.append({"name": name(rng.choice([1, 2])), "country": c, "length": str(rng.randint(40, 900)),
                           "hills": name(2), "lake": f"Lake {name(2)}"})
        for _ in range(4):
            cities.append({"name": name(rng.choice([2, 3])), "country": c, "river": rng.choice(rivers[-2:]),
                           "founded": str(rng.randint(int(c["founded"]) - 400, 1900)),
                           "landmark": f"{name(2)} {rng.choice(LANDMARKS)}"})
        c["capital"] = rng.choice(cities[-4:])
    for _ in range(144):
        people.append({"name": f"{name(2)} {name(rng.choice([2, 3]))}", "she": rng.random() < 0.5,
                       "profession": rng.choice(PROFESSIONS), "city": rng.choice(cities),
                       "born": rng.randint(1500, 1930), "topic": rng.choice(TOPICS)})
    people.sort(key=lambda p: p["born"])
    for p in people:
        elders = [q for q in people if 20 <= p["born"] - q["born"] <= 60]
        p["teacher"] = rng.choice(elders) if elders else None
    for p in people:
        p["born"] = str(p["born"])
    for p in rng.sample(people, 96):
        device = rng.choice(sorted(DEVICES))
        inventions.append({"name": f"{name(2)} {device}", "device": device, "inventor": p,
                           "year": str(int(p["born"]) + rng.randint(22, 60)), "material": rng.choice(MATERIALS)})

    for c in countries:
        c["id_a"] = passage(c["name"], f"{c['name']} is a {c['kind']} in the {c['part']} part of {c['continent']}. "
                            f"Its capital is {c['capital']['name']}, and its official language is {c['language']}. "
                            f"{c['name']} was founded in {c['founded']}.")
        c["id_b"] = passage(c["name"], f"The currency of {c['name']} is the {c['currency']}. The national animal "
                            f"of {c['name']} is the {c['animal']}, and its highest mountain is {c['mountain']}, "
                            f"which rises {c['height']} metres.")
    for r in rivers:
        r["id"] = passage(f"{r['name']} (river)", f"The river {r['name']} flows through {r['country']['name']} "
                          f"for {r['length']} kilometres. It rises in the {r['hills']} Hills and empties into "
                          f"{r['lake']}.")
    for t in cities:
        t["id"] = passage(t["name"], f"{t['name']} is a city in {t['country']['name']}, on the river "
                          f"{t['river']['name']}. It was founded in {t['founded']}. Its best-known landmark is "
                          f"the {t['landmark']}.")
    for p in people:
        he, his = ("She", "her") if p["she"] else ("He", "his")
        teacher = f" {he} studied under {p['teacher']['name']}." if p["teacher"] else ""
        a = "an" if p["profession"][0] in "aeiou" else "a"
        p["id"] = passage(p["name"], f"{p['name']} was {a} {p['profession']} born in {p['city']['name']} in "
                          f"{p['born']}.{teacher} {he} is remembered for {his} work on {p['topic']}.")
    for v in inventions:
        v["id"] = passage(f"{v['name']}", f"The {v['name']} was invented by {v['inventor']['name']} in "
                          f"{v['year']}. It was built of {v['material']} and used for {DEVICES[v['device']]}.")

    single = {
        "country": [("What is the capital of {name}?", lambda c: c["capital"]["name"], "id_a"),
                    ("What is the official language of {name}?", lambda c: c["language"], "id_a"),
                    ("In what year was {name} founded?", lambda c: c["founded"], "id_a"),
                    ("What is the currency of {name}?", lambda c: c["currency"], "id_b"),
                    ("What is the national animal of {name}?", lambda c: c["animal"], "id_b"),
                    ("What is the highest mountain of {name}?", lambda c: c["mountain"], "id_b")],
        "river": [("How many kilometres long is the river {name}?", lambda r: r["length"], "id"),
                  ("Into which lake does the river {name} empty?", lambda r: r["lake"], "id")],
        "city": [("In which country is the city of {name}?", lambda t: t["country"]["name"], "id"),
                 ("On which river does the city of {name} lie?", lambda t: t["river"]["name"], "id"),
                 ("In what year was the city of {name} founded?", lambda t: t["founded"], "id"),
                 ("What is the best-known landmark of {name}?", lambda t: t["landmark"], "id")],
        "person": [("In which city was {name} born?", lambda p: p["city"]["name"], "id"),
                   ("In what year was {name} born?", lambda p: p["born"], "id"),
                   ("What was the profession of {name}?", lambda p: p["profession"], "id")],
        "invention": [("Who invented the {name}?", lambda v: v["inventor"]["name"], "id"),
                      ("In what year was the {name} invented?", lambda v: v["year"], "id"),
                      ("What material was the {name} built of?", lambda v: v["material"], "id")],
    }
    per_entity = {"country": 3, "river": 1, "city": 1, "person": 1, "invention": 1}
    entities = {"country": countries, "river": rivers, "city": cities, "person": people, "invention": inventions}
    questions: list[tuple[dict, str]] = []  # (row, the entity it names)
    for kind, items in entities.items():
        for e in items:
            for template, answer, pid in rng.sample(single[kind], per_entity[kind]):
                questions.append(({"question": template.format(name=e["name"]), "answer": answer(e),
                                   "support": [e[pid]], "hops": 1}, e["name"]))

    not_capitals = [t for t in cities if t["country"]["capital"] is not t]
    taught = [p for p in people if p["teacher"]]
    two_hop = [
        (not_capitals, "What is the capital of the country in which the city of {name} lies?",
         lambda t: (t["country"]["capital"]["name"], [t["id"], t["country"]["id_a"]])),
        (not_capitals, "What is the currency of the country in which the city of {name} lies?",
         lambda t: (t["country"]["currency"], [t["id"], t["country"]["id_b"]])),
        (countries, "On which river does the capital of {name} lie?",
         lambda c: (c["capital"]["river"]["name"], [c["id_a"], c["capital"]["id"]])),
        (people, "In which country was {name} born?",
         lambda p: (p["city"]["country"]["name"], [p["id"], p["city"]["id"]])),
        (inventions, "In which city was the inventor of the {name} born?",
         lambda v: (v["inventor"]["city"]["name"], [v["id"], v["inventor"]["id"]])),
        (inventions, "What was the profession of the inventor of the {name}?",
         lambda v: (v["inventor"]["profession"], [v["id"], v["inventor"]["id"]])),
        (taught, "In which city was the teacher of {name} born?",
         lambda p: (p["teacher"]["city"]["name"], [p["id"], p["teacher"]["id"]])),
    ]
    for items, template, resolve in two_hop:
        for e in rng.sample(items, min(20, len(items))):
            answer, support = resolve(e)
            questions.append(({"question": template.format(name=e["name"]), "answer": answer, "support": support,
                               "hops": 2}, e["name"]))
    check(passages, questions)
    return passages, [{"uid": f"atlas-qa-{i:04d}", **q} for i, (q, _) in enumerate(questions)]


def words(text: str) -> str:
    return " " + " ".join(re.findall(r"[a-z0-9]+", text.lower())) + " "


def check(passages: list[dict], questions: list[tuple[dict, str]]) -> None:
    """Every question is unique, its answer is stated in its last supporting passage, and the entity it
    names (`subject`) in its first one."""
    by_id = {p["id"]: p["text"] for p in passages}
    assert len({q["question"] for q, _ in questions}) == len(questions), "duplicate questions"
    for q, subject in questions:
        assert words(q["answer"]) in words(by_id[q["support"][-1]]), q
        assert words(subject) in words(by_id[q["support"][0]]), q


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder to write the two files into")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    passages, rows = build_atlas(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / f"{NAME}.jsonl", passages)
    write_jsonl(args.out / f"{NAME}_qa.jsonl", rows)
    hops = sum(r["hops"] == 2 for r in rows)
    print(f"{len(passages)} passages, {len(rows)} questions ({len(rows) - hops} single-hop, {hops} two-hop) "
          f"in {args.out}")


if __name__ == "__main__":
    main()
