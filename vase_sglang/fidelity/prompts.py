"""32 instruction prompts that ask for long answers, written for the fidelity sweep.

Varied on purpose: explanations, step-by-step procedures, stories, letters, comparisons,
lists, code and arithmetic reasoning, so that no single style decides which policy wins.
Each asks for length, because the measure needs 1,024 generated tokens per prompt.
"""

from __future__ import annotations

PROMPTS: tuple[str, ...] = (
    "Explain in detail how a refrigerator keeps food cold. Describe each part of the cycle, step by step, and why each step matters.",
    "Write a long story about a lighthouse keeper who finds a message in a bottle. Describe the characters, the island and what happens over one stormy week.",
    "Give a detailed, step-by-step guide to planting and caring for a vegetable garden, from choosing the spot to the harvest.",
    "Explain the causes of the French Revolution and how the events unfolded from 1789 to 1799. Be thorough.",
    "Describe how the human heart works: its chambers, valves, the path of the blood and what happens during one heartbeat. Explain in depth.",
    "Write a detailed letter to a friend describing a two-week trip through Japan, day by day, with the places, the food and the people you met.",
    "Explain what photosynthesis is, where it happens in the plant, the light and dark reactions, and why it matters for life on Earth. Go into detail.",
    "Compare cats and dogs as pets in detail: cost, time, space, health, training, temperament and lifespan. Conclude with advice for a family.",
    "Solve step by step and explain every step: a train leaves at 9:00 at 80 km/h, a second train leaves the same station at 10:30 at 120 km/h on the same track. When and where does the second train catch up? Then make up three similar problems and solve them too.",
    "Write a Python program that manages a small library: books, members, loans and returns. Explain each function you write and show example usage.",
    "Explain how the internet works, from typing a web address to seeing the page: DNS, TCP/IP, HTTP, servers and browsers. Be detailed.",
    "Write a long fairy tale about a young baker who discovers that her bread can grant wishes, and the trouble it causes in her village.",
    "Describe the water cycle in detail, including evaporation, condensation, precipitation, runoff and groundwater, with examples from different climates.",
    "Give a detailed plan for learning to play the guitar in six months, week by week, with exercises, songs and tips for practice.",
    "Explain the theory of evolution by natural selection, with the evidence for it and several examples from different animals and plants.",
    "Write a detailed recipe book entry for five different soups, with ingredients, step-by-step instructions and serving suggestions for each.",
    "Explain how a bill becomes a law in the United States, step by step, including committees, votes, the president and possible vetoes.",
    "Describe a day in the life of a medieval farmer in detail, from waking up to going to sleep, across the four seasons.",
    "Explain the main ideas of supply and demand, with examples of markets, prices, shortages and surpluses. Then discuss what happens when a government sets a price limit.",
    "Write a long dialogue between a teacher and a student who is struggling with fractions, in which the teacher explains fractions from the beginning.",
    "Describe the solar system in detail: the sun and each planet in order, with their size, moons, atmosphere and what makes each one special.",
    "Give detailed advice on how to prepare for a job interview: research, answers to common questions, clothing, body language and the follow-up.",
    "Explain how vaccines work and how the immune system learns to fight a disease. Describe the different kinds of vaccines. Be thorough.",
    "Write a long adventure story about three friends who get lost in a forest and must find their way home before winter.",
    "Explain step by step how to build a small wooden bookshelf: tools, materials, measurements, cutting, assembly and finishing.",
    "Describe the history of the Roman Empire, from the founding of Rome to the fall of the Western Empire, with the most important events and people.",
    "Explain what climate change is, its causes, its effects on weather, oceans, animals and people, and what can be done about it. Go into depth.",
    "Write a detailed guide to saving money and managing a monthly budget for a student, with examples, a sample budget and common mistakes.",
    "Explain how computers store and process information: bits, bytes, memory, the processor, instructions and programs. Use examples.",
    "Write a long diary of a sailor on a ship crossing the Atlantic Ocean in the 1700s, with an entry for each day of a month.",
    "Describe how to train for a first marathon over four months, with the weekly plan, nutrition, sleep, injuries to avoid and race-day advice.",
    "Explain the rules of chess in detail, how each piece moves, special moves, and basic strategy for the opening, middle game and endgame.",
)
