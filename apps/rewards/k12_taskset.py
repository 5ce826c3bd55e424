"""A small K-12 taskset written here (no download, deterministic): short-answer questions in
science, language and history, each with a reference answer and graded answers (1 right,
0.5 partly right, 0 wrong) for the learned grader. For tests and the demo.

`k12_records()` gives the taskset's records as the importer takes them (JSONL / Parquet rows):
`question`, `answer` (the reference), `domain: k12`, `subject`, `graded_answers`.
`python -m apps.rewards.k12_taskset OUT.jsonl` writes them to a file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TypedDict

# subject, question, reference, a right answer, a partly right one, a wrong one.
_ITEMS: tuple[tuple[str, str, str, str, str, str], ...] = (
    ("science", "What gas do plants take in from the air to make their food?", "carbon dioxide",
     "Plants take in carbon dioxide from the air.", "A gas from the air, I think it is oxygen or carbon.",
     "Plants take in oxygen to make food."),
    ("science", "What is the process by which plants make food from sunlight called?", "photosynthesis",
     "It is called photosynthesis.", "Something with light, maybe photo-something.",
     "It is called respiration."),
    ("science", "What is the boiling point of water at sea level in degrees Celsius?", "100 degrees Celsius",
     "Water boils at 100 degrees Celsius at sea level.", "Around 90 or 100 degrees.",
     "Water boils at 50 degrees Celsius."),
    ("science", "Which planet is closest to the Sun?", "Mercury",
     "Mercury is the planet closest to the Sun.", "One of the small inner planets, Mercury or Venus.",
     "Jupiter is closest to the Sun."),
    ("science", "What force pulls objects toward the centre of the Earth?", "gravity",
     "Gravity pulls objects toward the Earth.", "Some kind of pull, a force like magnetism or gravity.",
     "Friction pulls objects down."),
    ("science", "What organ pumps blood around the human body?", "the heart",
     "The heart pumps blood around the body.", "An organ in the chest, the lungs or the heart.",
     "The liver pumps the blood."),
    ("science", "What are the three states of matter?", "solid, liquid and gas",
     "Solid, liquid and gas.", "Solid and liquid.",
     "Hot, cold and warm."),
    ("science", "What do we call an animal that eats only plants?", "a herbivore",
     "An animal that eats only plants is a herbivore.", "A plant eater, maybe an omnivore.",
     "It is called a carnivore."),
    ("science", "What is the chemical symbol for water?", "H2O",
     "The chemical formula of water is H2O.", "It has hydrogen and oxygen in it.",
     "The symbol for water is CO2."),
    ("science", "What part of the cell holds its genetic material?", "the nucleus",
     "The nucleus holds the genetic material.", "Somewhere in the middle of the cell.",
     "The cell wall holds the genes."),
    ("language", "What is the plural of the word 'child'?", "children",
     "The plural of child is children.", "Childs or children.",
     "The plural is childs."),
    ("language", "What kind of word describes a noun, such as 'blue' or 'tall'?", "an adjective",
     "A word that describes a noun is an adjective.", "A describing word, like an adverb.",
     "It is a verb."),
    ("language", "What is the past tense of the verb 'run'?", "ran",
     "The past tense of run is ran.", "Runned or ran.",
     "The past tense is runned."),
    ("language", "What is a word that means the opposite of another word called?", "an antonym",
     "A word with the opposite meaning is an antonym.", "An opposite word, a synonym maybe.",
     "It is called a synonym."),
    ("language", "What punctuation mark ends a question?", "a question mark",
     "A question ends with a question mark.", "A mark at the end of the sentence.",
     "A question ends with a comma."),
    ("language", "In the sentence 'The dog barked loudly', which word is the verb?", "barked",
     "The verb is barked.", "The word about what the dog did, loudly or barked.",
     "The verb is dog."),
    ("language", "What do we call a word that sounds the same as another but has a different meaning?",
     "a homophone", "Such a word is a homophone.", "A word that sounds alike, a rhyme.",
     "It is called a pronoun."),
    ("language", "Who wrote the play 'Romeo and Juliet'?", "William Shakespeare",
     "William Shakespeare wrote Romeo and Juliet.", "An English writer from long ago.",
     "Charles Dickens wrote it."),
    ("language", "What is the main character of a story called?", "the protagonist",
     "The main character is the protagonist.", "The hero, or the narrator.",
     "The main character is the antagonist."),
    ("language", "What is the plural of the word 'mouse' when it means the animal?", "mice",
     "The plural of mouse is mice.", "Mouses or mice.",
     "The plural is mouses."),
    ("history", "Who was the first president of the United States?", "George Washington",
     "George Washington was the first president.", "One of the founding fathers, Washington or Adams.",
     "Abraham Lincoln was the first president."),
    ("history", "In which year did the Second World War end?", "1945",
     "The Second World War ended in 1945.", "In the 1940s.",
     "It ended in 1918."),
    ("history", "Which ancient people built the pyramids of Giza?", "the ancient Egyptians",
     "The ancient Egyptians built the pyramids of Giza.", "An ancient people in Africa.",
     "The Romans built them."),
    ("history", "Who was the first person to walk on the Moon?", "Neil Armstrong",
     "Neil Armstrong was the first person on the Moon.", "An American astronaut in 1969.",
     "Yuri Gagarin walked on the Moon first."),
    ("history", "What wall divided the city of Berlin from 1961 to 1989?", "the Berlin Wall",
     "The Berlin Wall divided the city.", "A wall built during the Cold War.",
     "The Great Wall divided Berlin."),
    ("history", "Which ship sank on its first voyage in 1912 after hitting an iceberg?", "the Titanic",
     "The Titanic sank in 1912.", "A big British passenger ship.",
     "The Mayflower sank in 1912."),
    ("history", "Who was the queen of ancient Egypt who allied with Mark Antony?", "Cleopatra",
     "Cleopatra was that queen.", "An Egyptian queen, maybe Nefertiti or Cleopatra.",
     "Queen Victoria was the queen."),
    ("history", "Which empire was ruled by Julius Caesar's successors from Rome?", "the Roman Empire",
     "The Roman Empire was ruled from Rome.", "An empire in Italy.",
     "The Ottoman Empire was ruled from Rome."),
    ("history", "What document did King John of England sign in 1215?", "the Magna Carta",
     "King John signed the Magna Carta in 1215.", "A charter about the rights of barons.",
     "He signed the Declaration of Independence."),
    ("history", "Who is known for the theory of evolution by natural selection?", "Charles Darwin",
     "Charles Darwin described evolution by natural selection.", "A British naturalist who sailed on a ship.",
     "Isaac Newton wrote the theory of evolution."),
)

# Answers that say nothing: graded 0 on every question (people grade them so too).
_EMPTY = ("I don't know.", "Maybe.")


class GradedRecord(TypedDict):
    answer: str
    grade: float


class K12Record(TypedDict):
    question: str
    answer: str
    domain: str
    subject: str
    graded_answers: list[GradedRecord]


def k12_records() -> list[K12Record]:
    """The taskset's records, in a fixed order."""
    records: list[K12Record] = []
    for i, (subject, question, reference, right, partial, wrong) in enumerate(_ITEMS):
        graded: list[GradedRecord] = [{"answer": right, "grade": 1.0}, {"answer": partial, "grade": 0.5},
                  {"answer": wrong, "grade": 0.0}, {"answer": _EMPTY[i % len(_EMPTY)], "grade": 0.0}]
        records.append({"question": question, "answer": reference, "domain": "k12", "subject": subject,
                        "graded_answers": graded})
    return records


def k12_taskset_write(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in k12_records()), encoding="utf-8")
    return out


if __name__ == "__main__":  # pragma: no cover - a convenience for the demo
    if len(sys.argv) != 2:
        sys.exit("usage: python -m apps.rewards.k12_taskset OUT.jsonl")
    print(k12_taskset_write(Path(sys.argv[1])))
