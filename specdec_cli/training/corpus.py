"""Training prompts for `specdec train-draft --data`: a file of the user's, or a built-in set,
all made offline and sharing nothing with the benchmark prompts (Spec-Bench, bench/workload.py's):

- `python-docs`: the text every Python installation ships in `pydoc_data.topics` (the language
  reference's help topics; Python Software Foundation License), each paragraph put to the model
  with one of a few instructions (explain, summarise, translate, write...).
- `everyday`: the kinds of requests a chat model gets (writing, role play and characters,
  explanations of topics, concepts, people and places, short questions, logic puzzles, arithmetic
  word problems with generated numbers, small coding tasks, translation, summaries, extraction and
  questions over a given text), from templates and lists written here; the given texts are
  help-topic sentences.
- `mixed` (the default): both, shuffled together. A head trained on documentation prompts alone
  guesses poorly elsewhere (SmolLM2-135M: 42% of its first guesses right on held-out
  documentation prompts, 18% of steps on Spec-Bench's 13 categories).
"""

from __future__ import annotations

import random
from pathlib import Path

from ..errors import UsageError
from ..prompt_files import read_prompt_file

DEFAULT = "mixed"

TEMPLATES = (
    "Explain the following passage in plain words:\n\n{text}",
    "Summarize this in two sentences:\n\n{text}",
    "Write a short Python example that illustrates this:\n\n{text}",
    "Translate into French:\n\n{text}",
    "List three questions a student might ask about this text, with answers:\n\n{text}",
    "Rewrite this for a ten-year-old:\n\n{text}",
    "Write a short story in which a programmer runs into the following rule:\n\n{text}",
    "What are the key points of the '{topic}' topic described here?\n\n{text}",
    "Write a friendly email to a colleague explaining this:\n\n{text}",
    "Give a one-paragraph critique of how clearly this is written:\n\n{text}",
)


def python_docs_prompts() -> list[str]:
    """Every usable paragraph of the help topics under one template each, in a fixed order."""
    from pydoc_data.topics import topics

    prompts = []
    for topic in sorted(topics):
        for paragraph in topics[topic].split("\n\n"):
            text = " ".join(paragraph.split())
            if 120 <= len(text) <= 700 and not text.startswith(("*", "|", "+")):
                template = TEMPLATES[len(prompts) % len(TEMPLATES)]
                prompts.append(template.format(text=text, topic=topic))
    random.Random(0).shuffle(prompts)
    return list(dict.fromkeys(prompts))  # a paragraph repeated under two topics would straddle the held-out split


TOPICS = (
    "the ocean tides", "a lighthouse keeper", "photosynthesis", "the Roman Empire", "volcanoes", "a small bakery",
    "time management", "electric cars", "recycling", "the first moon landing", "chess", "friendship", "a rainy afternoon",
    "the stock market", "vaccines", "honeybees", "working from home", "the printing press", "glaciers", "neural networks",
    "a mountain village", "the human heart", "vegetable gardening", "jazz", "the early internet", "a job interview",
    "sleep", "coffee", "desert animals", "steam trains", "solar panels", "the water cycle", "public libraries",
    "the Silk Road", "black holes", "a city marathon", "learning a second language", "bread making", "urban parks",
    "the immune system", "ancient Egypt", "wind farms", "a school science fair", "board games", "the French Revolution",
    "coral reefs", "budgeting for a family", "video game design", "migratory birds", "a night market", "earthquakes",
    "the periodic table", "a camping trip", "renewable energy", "the Renaissance", "online privacy", "street food",
    "a robot vacuum cleaner", "plate tectonics", "the violin", "a lost wallet", "a community garden", "antibiotics",
    "the Great Wall of China", "space telescopes", "minimalism", "a thunderstorm", "the history of writing", "penguins",
    "a small software startup", "the Olympic Games", "rain forests", "bicycles in cities", "a museum at night",
    "the speed of light", "a family reunion", "origami", "the Industrial Revolution", "sharks", "a broken umbrella",
    "democracy", "mushrooms", "a first day at a new job", "satellites", "the Amazon river", "tea ceremonies",
    "a forgotten diary", "magnetism", "hiking safety", "a lunar eclipse", "the Vikings", "smartphones and attention",
)
TOPIC_TASKS = (
    "Write a short poem about {topic}.", "Write a short story about {topic}.",
    "Write the opening paragraph of a blog post about {topic}.", "Write a persuasive paragraph about {topic}.",
    "Pretend you are a tour guide and talk about {topic}.", "You are a teacher. Explain {topic} to your class.",
    "Act as a news reporter covering a story about {topic}.", "Explain {topic} in simple terms.",
    "What are three interesting facts about {topic}?", "What are the pros and cons of {topic}?",
    "Give a short history of {topic}.", "Why does {topic} matter to ordinary people?",
    "Explain {topic} with an analogy, and say where the analogy breaks down.",
    "Compare {topic} and {other} in a few sentences.", "Write a short dialogue between two friends about {topic}.",
    "Write three quiz questions about {topic}, with answers.", "Describe {topic} to someone who has never heard of it.",
    "What would a beginner get wrong about {topic}?", "In one or two sentences, what is {topic}?",
    "Briefly, what should everyone know about {topic}?", "Write a formal letter to a newspaper about {topic}.",
    "Write a short speech about {topic} for a school assembly.", "Summarise the main debates about {topic}.",
    "Write a product description for something related to {topic}.", "Give five tips for someone interested in {topic}.",
    "Write a haiku about {topic}, then explain it.",
)
TOPIC_TASKS_EACH = 12  # of TOPIC_TASKS per topic, drawn by a seeded sample
CODING_TASKS = (
    "counts the vowels in a sentence", "checks whether a number is prime", "merges two sorted lists",
    "computes the factorial of n", "finds the largest element of a list without using max()",
    "removes duplicates from a list while keeping the order", "converts Celsius to Fahrenheit",
    "returns the n-th Fibonacci number", "counts how often each word occurs in a text", "flattens a nested list",
    "checks whether two words are anagrams", "returns the second smallest number of a list",
    "capitalises the first letter of every word", "computes the average of a list of numbers",
    "finds the common elements of two lists", "converts a binary string to an integer", "rotates a list by k places",
    "checks whether brackets in a string are balanced", "returns the digits of an integer as a list",
    "groups a list of words by their first letter", "computes the greatest common divisor of two numbers",
    "splits a list into chunks of size n", "sorts a list of dictionaries by a key", "reads a CSV file and sums a column",
    "reverses the words of a sentence", "checks whether a string is a palindrome", "counts the lines of a text file",
    "returns the longest word of a sentence", "converts a Roman numeral to an integer", "transposes a matrix",
    "finds all pairs of numbers in a list that add up to a target", "validates an email address with a regular expression",
    "computes the running total of a list", "returns the n smallest items of a list", "checks whether a year is a leap year",
    "implements binary search on a sorted list", "counts the uppercase letters in a string", "merges two dictionaries",
    "computes the dot product of two vectors", "generates the first n prime numbers",
)
CODING_TEMPLATES = (
    "Write a Python function that {task}.", "Write a JavaScript function that {task}.",
    "Write a Python function that {task}, and explain how it works.", "Write a Python function that {task}, with tests.",
    "Write a C++ function that {task}.", "How would you write a function that {task}? Give the code and its time complexity.",
)
LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese")
TEXT_TASKS = (
    "Translate into {language}:\n\n{sentence}",
    "List the technical terms in this text, one per line:\n\n{text}",
    "Read the text and answer the question.\n\nText: {text}\n\nQuestion: what is the main point of the text?",
    "Extract every name, keyword or number from this text as a bulleted list:\n\n{text}",
    "Give this text a short title, then summarise it in one sentence:\n\n{text}",
    "Summarize the following passage in a short paragraph:\n\n{text}",
    "Using only the passage below, answer: what does it say should happen, and when?\n\nPassage: {text}",
    "Rewrite this text as a numbered list of steps or facts:\n\n{text}",
)
PEOPLE = (
    "Marie Curie", "Leonardo da Vinci", "Isaac Newton", "Ada Lovelace", "Mahatma Gandhi", "Cleopatra", "Albert Einstein",
    "Frida Kahlo", "Nelson Mandela", "Charles Darwin", "Jane Austen", "Galileo Galilei", "Florence Nightingale",
    "Confucius", "Nikola Tesla", "Amelia Earhart", "William Shakespeare", "Rosa Parks", "Ludwig van Beethoven",
    "Alan Turing", "Joan of Arc", "Harriet Tubman", "Pablo Picasso", "Aristotle", "Wolfgang Amadeus Mozart",
)
PERSON_TASKS = (
    "Who was {name}, and why are they remembered?", "Write a short biography of {name}.",
    "Imagine you are {name}. Describe a typical day in your life.", "What can people today learn from {name}?",
    "Write an imaginary interview with {name} about their work.", "List three achievements of {name}.",
)
PLACES = (
    "Paris", "Tokyo", "Cairo", "Rio de Janeiro", "Iceland", "the Sahara", "Venice", "New York City", "Kenya",
    "the Himalayas", "Sydney", "Istanbul", "Mexico City", "Norway", "Peru", "Vietnam", "Scotland", "Morocco",
    "Canada", "Bali",
)
PLACE_TASKS = (
    "Write a short travel guide to {name}.", "What is {name} known for?", "Plan a three-day trip to {name}.",
    "Describe the climate and geography of {name}.", "Write a postcard home from {name}.",
)
PERSONAS = (
    "a pirate captain", "a medieval knight", "a detective in 1920s London", "a friendly robot", "a grumpy wizard",
    "the commander of a space station", "a chef on a cooking show", "a sports commentator", "a museum guide",
    "a fitness coach", "a customer support agent", "a time traveller from the year 3000", "a wise old farmer",
    "a nervous first-time pilot", "a famous fashion designer",
)
PERSONA_REQUESTS = (
    "Introduce yourself.", "Give me advice about starting a new hobby.", "Tell me about the best day of your life.",
    "Explain how to make a cup of tea.", "What do you think of modern technology?", "Describe where you work.",
    "What is the secret to happiness?", "Convince me to join your team.",
)
CONCEPTS = (
    "entropy", "natural selection", "supply and demand", "opportunity cost", "the Pythagorean theorem", "inertia",
    "osmosis", "compound interest", "the placebo effect", "cognitive dissonance", "inflation", "DNA replication",
    "the greenhouse effect", "probability", "recursion", "the scientific method", "gravity", "democracy",
    "the separation of powers", "utilitarianism", "the water cycle", "electric current", "biodiversity",
    "the law of diminishing returns", "plate tectonics",
)
CONCEPT_TASKS = (
    "Explain {name} and give an everyday example.", "How would you teach {name} to a high-school student?",
    "What are common misconceptions about {name}?", "Write an exam question about {name} and a model answer.",
)
NAMES = ("Alice", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kofi", "Lena")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def math_prompts(rng: random.Random, count: int) -> list[str]:
    """Arithmetic word problems with generated numbers."""
    makers = (
        lambda a, b, c: f"Tom has {a} marbles and buys {b} bags of {c} marbles each. How many marbles does he have now? Explain step by step.",
        lambda a, b, c: f"What is {a} times {b} plus {c}? Show your work.",
        lambda a, b, c: f"A cyclist rides {a * b} km in {b} hours. What is her average speed? Explain your reasoning.",
        lambda a, b, c: f"Solve for x: {b}x + {c} = {b * a + c}.",
        lambda a, b, c: f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
        lambda a, b, c: f"A shirt costs {a * 4} dollars and is on sale for {c % 50 + 10}% off. What is the sale price?",
        lambda a, b, c: f"A class has {a + b} students; {b} of them walk to school and the rest take the bus. What fraction takes the bus?",
        lambda a, b, c: f"Anna saves {b} dollars a week. How many weeks does she need to save {a * b + c} dollars?",
    )
    prompts = []
    for i in range(count):
        a, b, c = rng.randint(3, 60), rng.randint(2, 12), rng.randint(1, 99)
        prompts.append(makers[i % len(makers)](a, b, c))
    return prompts


def reasoning_prompts(rng: random.Random, count: int) -> list[str]:
    """Small logic puzzles with generated names and numbers."""
    makers = (
        lambda a, b, c, n, d: f"{a} is taller than {b}, and {b} is taller than {c}. Who is the shortest? Explain your reasoning.",
        lambda a, b, c, n, d: f"What is the next number in the sequence {n}, {n + d}, {n + 2 * d}, {n + 3 * d}? Explain the pattern.",
        lambda a, b, c, n, d: f"If today is {DAYS[n % 7]}, what day of the week will it be in {n + d} days? Think step by step.",
        lambda a, b, c, n, d: f"{a} finished a race before {b} but after {c}. Who came first? Explain.",
        lambda a, b, c, n, d: f"{a} has twice as many books as {b}, and {b} has {d} books. How many books do they have together?",
        lambda a, b, c, n, d: f"All the cats in {a}'s house are black. {b} saw a white animal in {a}'s house. Can it be a cat? Explain.",
    )
    prompts = []
    for i in range(count):
        a, b, c = rng.sample(NAMES, 3)
        prompts.append(makers[i % len(makers)](a, b, c, rng.randint(2, 40), rng.randint(2, 9)))
    return prompts


def named_prompts(rng: random.Random) -> list[str]:
    """People, places and concepts under 4 of their tasks each, and personas under 6 requests."""
    prompts = []
    for names, tasks in ((PEOPLE, PERSON_TASKS), (PLACES, PLACE_TASKS), (CONCEPTS, CONCEPT_TASKS)):
        for name in names:
            prompts += [task.format(name=name) for task in rng.sample(tasks, 4)]
    for persona in PERSONAS:
        for request in rng.sample(PERSONA_REQUESTS, 6):
            prompts.append(f"You are {persona}. Stay in character. {request}")
    return prompts


def help_sentences() -> list[str]:
    """Whole sentences of the help topics (the texts the text tasks work on)."""
    from pydoc_data.topics import topics

    sentences = []
    for topic in sorted(topics):
        for paragraph in topics[topic].split("\n\n"):
            text = " ".join(paragraph.split())
            if text.startswith(("*", "|", "+")):
                continue
            sentences += [s.strip() + "." for s in text.split(". ") if 60 <= len(s) <= 240]
    return sentences


def everyday_prompts() -> list[str]:
    """Chat-style requests across many kinds of task, in a fixed order (see the module's note)."""
    rng = random.Random(1)
    prompts = []
    for i, topic in enumerate(TOPICS):
        for task in rng.sample(TOPIC_TASKS, TOPIC_TASKS_EACH):
            prompts.append(task.format(topic=topic, other=TOPICS[(i + 7) % len(TOPICS)]))
    prompts += math_prompts(rng, 300)
    prompts += [template.format(task=task) for task in CODING_TASKS for template in rng.sample(CODING_TEMPLATES, 4)]
    prompts += reasoning_prompts(rng, 120)
    prompts += named_prompts(rng)
    sentences = help_sentences()
    rng.shuffle(sentences)
    for i in range(400):
        text = " ".join(sentences[3 * i : 3 * i + 3 + i % 3])
        prompts.append(TEXT_TASKS[i % len(TEXT_TASKS)].format(language=LANGUAGES[i % len(LANGUAGES)], sentence=sentences[i], text=text))
    rng.shuffle(prompts)
    return list(dict.fromkeys(prompts))


BUILTINS = {
    "python-docs": python_docs_prompts,
    "everyday": everyday_prompts,
    "mixed": lambda: sorted(python_docs_prompts() + everyday_prompts(), key=lambda p: random.Random(p).random()),
}


def read_prompts(data: str) -> list[str]:
    """A built-in set (BUILTINS) or a prompt file (prompt_files.py)."""
    if data in BUILTINS:
        return BUILTINS[data]()
    path = Path(data).expanduser()
    if not path.is_file():
        raise UsageError(f"--data: '{data}' is not a file (give a .txt or .jsonl of prompts, or one of {', '.join(BUILTINS)})")
    prompts = [row.text for row in read_prompt_file(path, "--data")]
    if len(prompts) < 2:
        raise UsageError(f"--data: '{data}' holds {len(prompts)} prompt(s); give at least 2 (one is held out to measure)")
    return prompts
