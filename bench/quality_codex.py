"""The generated Codex of `ahc bench quality`: facts planted in filler text, and a question per fact
with one exact answer.

Seeded, so every run (and every mode of one run) asks the same questions of the same documents. The
filler is plausible prose about a harbour town's records, made from phrase lists that hold no digit,
no keeper's name and no password word: each answer appears in the Codex exactly once, where its fact
was planted, and no answer is a part of another (a reply is right when it contains its answer, case
aside). Three kinds of fact, taken in turn:

    The access code of the north vault is 4817.     What is the access code of the north vault?
    The keeper of the river mill is named Oswin.    What is the name of the keeper of the river mill?
    The password for the old granary is juniper.    What is the password for the old granary?
"""

from __future__ import annotations

import random
from dataclasses import dataclass

PLACES = ("north", "south", "east", "west", "upper", "lower", "old", "new", "harbour", "river", "hill", "market")
STRUCTURES = ("vault", "mill", "lighthouse", "archive", "granary", "bell tower", "chapel", "warehouse",
              "observatory", "foundry", "boathouse", "armoury")
NAMES = ("Oswin", "Marisol", "Thaddeus", "Ingrid", "Bartholomew", "Rosalind", "Cassius", "Henrietta", "Leopold",
         "Ottilie", "Percival", "Winifred", "Ignatius", "Philippa", "Lysander", "Gwendolyn", "Ambrose", "Clementine",
         "Fenwick", "Isolde", "Jasper", "Mirabel", "Ptolemy", "Seraphina", "Tobias", "Ulrika", "Valentin",
         "Wilhelmina", "Zebedee", "Beatrix", "Cornelius", "Delphine", "Evander", "Florian", "Griselda", "Horatio",
         "Imogen", "Lucian", "Octavia", "Quentin")
PASSWORDS = ("marmalade", "juniper", "tangerine", "cobalt", "saffron", "pelican", "quartz", "walrus", "hazelnut",
             "tambourine", "zeppelin", "porcupine", "mandolin", "gazebo", "kumquat", "origami", "trombone", "meringue",
             "flamingo", "labyrinth", "nutmeg", "pistachio", "sapphire", "tortoise", "vermilion", "xylophone",
             "avocado", "bagpipe", "chameleon", "dandelion", "eucalyptus", "gondola", "hyacinth", "iguana",
             "jellyfish", "kaleidoscope", "lemonade", "macaroni", "narwhal", "octopus")
KINDS = ("code", "keeper", "password")
# Every subject is a place and a structure; each kind has fewer answers than subjects.
MAX_QUESTIONS = 3 * min(len(NAMES), len(PASSWORDS))

SUBJECTS = ("The harbour committee", "The night watch", "A visiting surveyor", "The old ledger", "The market guild",
            "The river pilots", "The weather station", "The town clerk", "The ferry company", "The school board",
            "The fishing cooperative", "A travelling engineer", "The parish council", "The lamplighters")
ACTIONS = ("met on a rainy afternoon to discuss", "wrote a long letter about", "kept careful records of",
           "raised concerns about", "spent the winter arguing over", "published a short notice on",
           "asked for more money to deal with", "made a survey of", "complained to the mayor about",
           "drew up a plan for", "reported steady progress on", "postponed any decision on")
OBJECTS = ("the repairs to the eastern pier", "the price of lamp oil", "the flooding in the lower streets",
           "the schedule of the grain barges", "the condition of the coastal road", "the supply of dry firewood",
           "the noise from the shipyard", "the state of the public wells", "the fees charged at the toll gate",
           "the shortage of rope and canvas", "the silting of the inner basin", "the upkeep of the sea wall",
           "the timetable of the mail coach", "the quality of the bread sold at the quay")
TAILS = ("", " before the first frost", " after the spring fair", " without much success", " at some expense",
         " for the third time that year", " while the tide was out", " in the presence of several witnesses",
         " as the season turned", " despite the bad weather")
ASIDES = ("Nobody in the town was surprised by this.", "The matter was recorded in the minutes and then forgotten.",
          "Several residents wrote to the newspaper in response.", "It was, by all accounts, a tedious business.",
          "The discussion ran well past the usual hour.", "Little changed in the weeks that followed.",
          "The clerk noted that the same point had been raised before.", "Opinions in the taverns were divided.")


@dataclass(frozen=True)
class Question:
    text: str
    answer: str
    document: str  # the id of the document its fact was planted in


@dataclass(frozen=True)
class QualityCodex:
    documents: tuple[dict[str, str], ...]  # {"id", "text"}: Codex entries as a request carries them
    questions: tuple[Question, ...]  # in the order they are asked


def fact_and_question(kind: str, subject: str, answer: str) -> tuple[str, str]:
    if kind == "code":
        return f"The access code of the {subject} is {answer}.", f"What is the access code of the {subject}?"
    if kind == "keeper":
        return f"The keeper of the {subject} is named {answer}.", f"What is the name of the keeper of the {subject}?"
    return f"The password for the {subject} is {answer}.", f"What is the password for the {subject}?"


def filler_sentence(rng: random.Random) -> str:
    if rng.random() < 0.15:
        return rng.choice(ASIDES)
    return f"{rng.choice(SUBJECTS)} {rng.choice(ACTIONS)} {rng.choice(OBJECTS)}{rng.choice(TAILS)}."


def generate(questions: int = 24, documents: int = 4, filler: int = 6, seed: int = 0) -> QualityCodex:
    """`questions` facts (kinds in turn) planted in `documents` documents, `filler` sentences of
    filler per fact (the Codex is about 20 tokens a sentence); the questions in a seeded order."""
    if not 1 <= questions <= MAX_QUESTIONS:
        raise ValueError(f"questions must be from 1 to {MAX_QUESTIONS}")
    if not 1 <= documents <= questions:
        raise ValueError("documents must be from 1 to the number of questions")
    if filler < 0:
        raise ValueError("filler must be at least 0")
    rng = random.Random(seed)
    subjects = rng.sample([f"{place} {structure}" for place in PLACES for structure in STRUCTURES], questions)
    answers = {"code": [str(n) for n in rng.sample(range(1000, 10000), questions)],
               "keeper": rng.sample(NAMES, len(NAMES)), "password": rng.sample(PASSWORDS, len(PASSWORDS))}
    facts: list[tuple[str, Question]] = []
    for i, subject in enumerate(subjects):
        kind = KINDS[i % len(KINDS)]
        fact, question = fact_and_question(kind, subject, answers[kind][i // len(KINDS)])
        facts.append((fact, Question(question, answers[kind][i // len(KINDS)], f"record-{i % documents + 1}")))
    docs = []
    for d in range(documents):
        doc_id = f"record-{d + 1}"
        paragraphs = []
        for fact, _ in (f for f in facts if f[1].document == doc_id):
            sentences = [filler_sentence(rng) for _ in range(filler)]
            sentences.insert(rng.randint(0, len(sentences)), fact)
            paragraphs.append(" ".join(sentences))
        docs.append({"id": doc_id, "text": f"Town records, part {d + 1}.\n\n" + "\n\n".join(paragraphs)})
    asked = [question for _, question in facts]
    rng.shuffle(asked)
    return QualityCodex(tuple(docs), tuple(asked))
