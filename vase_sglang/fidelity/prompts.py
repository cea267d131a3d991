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

# Step-by-step solutions of math and logic problems: the chains of thought users serve.
REASONING: tuple[str, ...] = (
    "Solve step by step, showing every calculation: a shop sells pencils at 3 for $1 and pens at $1.25 each. Maria buys 12 pencils and some pens and pays $11.50 in all. How many pens did she buy? Check your answer.",
    "Think step by step: if 5 machines make 5 widgets in 5 minutes, how long do 100 machines take to make 100 widgets? Explain the reasoning carefully, then solve two variations of the problem.",
    "Prove step by step that the sum of the first n odd numbers is n squared. Then verify it for n = 1 to 6 and explain why the proof works.",
    "Three friends, Ann, Ben and Cal, each own one pet: a cat, a dog or a fish. Ann does not own the dog. Ben owns neither the cat nor the fish. Who owns which pet? Reason through every case step by step.",
    "Solve the system of equations 2x + 3y = 13 and 4x - y = 5 step by step, by substitution and then by elimination, and check the solution in both equations.",
    "A rectangle's length is 3 cm more than twice its width, and its perimeter is 48 cm. Find its dimensions and area. Show each step and explain each equation you write.",
    "Think carefully and step by step: how many ways can 5 people sit in a row if two of them refuse to sit next to each other? Explain the counting, then check it another way.",
    "A bag has 4 red, 5 blue and 6 green marbles. Two are drawn without replacement. What is the probability that both are the same colour? Work through it step by step.",
    "Find all integer solutions of x^2 - y^2 = 45. Reason step by step, explain the factoring, and list every solution with a check.",
    "A car travels 150 km at 60 km/h and returns at 40 km/h. What is its average speed for the round trip? Explain step by step why the answer is not 50 km/h.",
    "Solve step by step: what is the smallest positive integer that leaves remainder 2 when divided by 3, remainder 3 when divided by 5, and remainder 2 when divided by 7? Explain the method.",
    "On an island, knights always tell the truth and knaves always lie. A says: 'B is a knave.' B says: 'A and I are of the same kind.' What are A and B? Reason through every possibility step by step.",
    "Compute the sum 1/(1*2) + 1/(2*3) + ... + 1/(99*100) step by step. Explain the telescoping trick and prove the general formula.",
    "A tank fills through pipe A in 6 hours and through pipe B in 9 hours, and drains through pipe C in 12 hours. With all three open, how long does it take to fill? Solve step by step and check.",
    "Step by step, find the number of trailing zeros of 100 factorial, explain why the method works, and then do the same for 250 factorial.",
    "Determine step by step whether 221, 223 and 227 are prime. Explain the trial division you use and why it is enough to stop at the square root.",
)

# Programs to write and explain: long structured outputs with repeated identifiers.
CODE: tuple[str, ...] = (
    "Write a Python class for a bank account with deposits, withdrawals, a transaction history and interest. Explain each method and show example usage.",
    "Write a Python function that parses a CSV file of sales records and prints totals per month and per product. Explain the code line by line.",
    "Implement a binary search tree in Python with insert, search, delete and in-order traversal. Explain how delete handles each case.",
    "Write a command-line to-do list program in Python that saves tasks to a JSON file, with add, list, done and remove commands. Explain the design.",
    "Implement Dijkstra's shortest path algorithm in Python with a priority queue, test it on a small graph, and explain each step of the algorithm.",
    "Write a JavaScript function that validates a sign-up form (name, email, password strength, matching passwords) and shows error messages. Explain it.",
    "Write a Python program that simulates a simple vending machine as a state machine, with coins, selections and change. Explain every state.",
    "Implement a least-recently-used cache in Python from scratch, with get and put in constant time. Explain the data structures and test it.",
    "Write SQL to create tables for a small school (students, courses, enrolments, grades) and queries for common reports. Explain each query.",
    "Write a Python script that reads a text file and reports word frequencies, the longest words and the average sentence length. Explain the code.",
    "Implement merge sort and quicksort in Python, compare them on random lists, and explain their time complexity and when each is better.",
    "Write a small Python game of tic-tac-toe for two players in the terminal, with win and draw detection. Explain how the board is checked.",
    "Write a Python function that converts Roman numerals to integers and back, with input validation and tests. Explain the rules it follows.",
    "Implement a simple linked list in C with insert, delete, reverse and print functions. Explain the pointer handling in each function.",
    "Write a Python class that models a matrix with addition, multiplication, transpose and determinant. Explain each method and show examples.",
    "Write a Python program that schedules meetings for a team, avoiding overlaps and respecting working hours. Explain the algorithm and test it.",
)

PROMPT_SETS: dict[str, tuple[str, ...]] = {"longform": PROMPTS, "reasoning": REASONING, "code": CODE}
