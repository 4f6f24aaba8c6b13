"""Two small shipped writing tasks for the token-level credit methods, so their recipes run offline.

- `stay_in_language` (TLPO, docs/methods/tlpo.md): short questions to answer in the language they ask for:
  most in English, a few in Russian and French. Each row's `target_lang` is the language the reply must stay
  in, which the token pair source and `language_match` read.
- `staged_abstracts` (StructPO, docs/methods/structpo.md): a research topic to write a four-stage abstract
  about, each stage opened by its tag (`<background>`, `<gap>`, `<method>`, `<contributions>`); each row's
  `keywords` are what the rule-based scorer's global score looks for.

Neither has a gold answer (`answer` is empty): their rewards judge the reply itself.
"""
from __future__ import annotations

from lmrl.config import TaskConfig
from lmrl.envs.tasks import TASKS, TaskData, split_rows

QUESTIONS = [
    ("en", "Why is the sky blue? Answer in English in two sentences."),
    ("en", "What does a bee do in a garden? Answer in English."),
    ("en", "Describe a rainy morning in English, in three sentences."),
    ("en", "How do you make a cup of tea? Reply in English."),
    ("en", "What is a river? Explain it in English to a child."),
    ("en", "Why do leaves fall in autumn? Answer in English."),
    ("en", "What do cats like to eat? Reply in English in one sentence."),
    ("en", "Describe the moon in English."),
    ("en", "What is bread made of? Answer in English."),
    ("en", "Why do we sleep? Explain in English, briefly."),
    ("en", "What is a library for? Answer in English."),
    ("en", "Describe a busy market in English."),
    ("en", "How does a bicycle move? Answer in English."),
    ("en", "What is snow? Explain in English in two sentences."),
    ("ru", "Почему небо голубое? Ответь по-русски."),
    ("ru", "Что такое река? Объясни по-русски ребёнку."),
    ("ru", "Опиши зимнее утро по-русски в двух предложениях."),
    ("ru", "Как приготовить чай? Ответь по-русски."),
    ("fr", "Pourquoi le ciel est-il bleu ? Réponds en français."),
    ("fr", "Décris un marché animé en français."),
]

TOPICS = [
    ("retrieval for question answering over long documents", ["retrieval", "documents", "questions"]),
    ("energy use of training small language models", ["energy", "training", "models"]),
    ("detecting bugs in student programs", ["bugs", "students", "programs"]),
    ("counting birds from audio recordings", ["birds", "audio", "counting"]),
    ("predicting crop yield from satellite images", ["crop", "satellite", "images"]),
    ("translating medical leaflets into plain language", ["medical", "translation", "plain"]),
    ("scheduling buses in a small city", ["buses", "scheduling", "city"]),
    ("compressing sensor data on microcontrollers", ["compression", "sensor", "microcontrollers"]),
    ("summarising meeting transcripts", ["meetings", "transcripts", "summaries"]),
    ("finding duplicate questions on a forum", ["duplicate", "questions", "forum"]),
    ("estimating traffic from phone signals", ["traffic", "phones", "signals"]),
    ("teaching arithmetic with games", ["arithmetic", "games", "teaching"]),
]
STAGED_PROMPT = ("Write a short research abstract about {topic} in four stages, each opened by its tag: <background> "
                 "what is known, <gap> what is missing, <method> what you propose, <contributions> what you deliver.")


@TASKS.register("stay_in_language", "short questions to answer in the language they ask for (English, a few Russian "
                "and French): each row's target_lang, for TLPO and language_match", splits_rows=True)
def stay_in_language_task(cfg: TaskConfig) -> TaskData:
    rows = [{"uid": f"lang-{i}", "question": q, "answer": "", "target_lang": lang}
            for i, (lang, q) in enumerate(QUESTIONS)]
    return split_rows(rows, cfg, "stay_in_language")


@TASKS.register("staged_abstracts", "research topics to write a four-stage tagged abstract about (<background> <gap> "
                "<method> <contributions>), with keywords, for StructPO", splits_rows=True)
def staged_abstracts_task(cfg: TaskConfig) -> TaskData:
    rows = [{"uid": f"abstract-{i}", "question": STAGED_PROMPT.format(topic=topic), "answer": "", "keywords": words}
            for i, (topic, words) in enumerate(TOPICS)]
    return split_rows(rows, cfg, "staged_abstracts")
