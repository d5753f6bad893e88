# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Math word problems from templates with random numbers (drawn so that answers are whole numbers), as a source of
math prompts.
"""

from __future__ import annotations

import random

NAMES = ("Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hugo", "Iris", "Jonas", "Kemi", "Liam", "Mei",
         "Noah", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq")
ITEMS = ("apples", "pencils", "stickers", "marbles", "books", "cookies", "cards", "shells", "bottles", "stamps")


def _templates():
    # Each returns a problem text from an rng; the numbers are drawn so answers are whole numbers.
    def t1(r):
        n, a, b = r.choice(NAMES), r.randint(12, 90), r.randint(2, 11)
        return (f"{n} has {a} {r.choice(ITEMS)}. {n} buys {b} more packs with {r.randint(3, 12)} in each pack. "
                f"How many does {n} have now?")

    def t2(r):
        n, price, qty, paid = r.choice(NAMES), r.randint(2, 15), r.randint(2, 9), 0
        paid = (price * qty // 10 + 1) * 10 + r.choice((0, 10, 20))
        return f"{n} buys {qty} notebooks that cost ${price} each and pays with ${paid}. How much change does {n} get?"

    def t3(r):
        speed, hours = r.randint(30, 90), r.randint(2, 7)
        return (f"A train travels at {speed} km per hour for {hours} hours, "
                f"then at {speed + r.randint(5, 20)} km per hour for {r.randint(1, 4)} more hours. "
                "How far does it travel in total?")

    def t4(r):
        w, l = r.randint(3, 30), r.randint(3, 30)
        return (f"A rectangular garden is {w} meters wide and {l} meters long. "
                f"A fence costs ${r.randint(4, 25)} per meter. How much does it cost to fence the whole garden?")

    def t5(r):
        total, pct = r.randint(4, 40) * 20, r.choice((10, 15, 20, 25, 30, 40, 50, 75))
        return f"A jacket costs ${total}. It is on sale for {pct}% off. What is the sale price?"

    def t6(r):
        n, m, k = r.choice(NAMES), r.randint(2, 6), r.randint(10, 60)
        return (f"{n} reads {k} pages a day. A book has {k * m * 7 + r.randint(1, k)} pages. "
                f"How many full weeks does {n} need to finish the book, and how many pages are left after those weeks?")

    def t7(r):
        a, b = r.sample(NAMES, 2)
        x, age, years = r.randint(2, 30), r.randint(4, 50), r.randint(2, 10)
        return (f"{a} is {x} years older than {b}. "
                f"In {years} years the sum of their ages will be {2 * age + x + 2 * years}. How old is {b} now?")

    def t8(r):
        workers, days = r.randint(2, 12), r.randint(3, 20)
        return (f"{workers} workers can build a wall in {days} days. "
                f"How many days would {workers * r.choice((2, 3))} workers working at the same rate need?")

    def t9(r):
        a, b, c, d = (r.randint(55, 99) for _ in range(4))
        return (f"A student scored {a}, {b} and {c} on three tests. "
                f"What score is needed on the fourth test to have an average of {(a + b + c + d) / 4:g}?")

    def t10(r):
        n, hourly, hours = r.choice(NAMES), r.randint(9, 40), r.randint(10, 45)
        return (f"{n} earns ${hourly} per hour and worked {hours} hours this week. "
                f"{n} spends one quarter of the pay on rent and ${r.randint(10, 80)} on food. How much money is left?")

    def t11(r):
        red, blue = r.randint(2, 12), r.randint(2, 12)
        return (f"A bag has {red} red balls and {blue} blue balls. If two balls are drawn without replacement, "
                "what is the probability that both are red?")

    def t12(r):
        a, d, n = r.randint(1, 20), r.randint(2, 9), r.randint(8, 40)
        return (f"An arithmetic sequence starts at {a} and increases by {d} each step. "
                f"What is the sum of its first {n} terms?")

    def t13(r):
        p, rate, years = r.randint(5, 50) * 100, r.choice((2, 3, 4, 5, 6, 8)), r.randint(2, 5)
        return f"${p} is invested at {rate}% interest compounded yearly. How much is it worth after {years} years?"

    def t14(r):
        a, b = r.randint(2, 20), r.randint(2, 20)
        return f"Solve for x: {a}x + {b} = {a * r.randint(1, 15) + b}."

    def t15(r):
        n, cups = r.choice(NAMES), r.randint(2, 6)
        return (f"A recipe for {r.randint(2, 6)} people needs {cups} cups of flour. "
                f"{n} wants to cook for {r.randint(7, 24)} people. How many cups of flour are needed?")

    def t16(r):
        tank, fill, leak = r.randint(100, 900), r.randint(20, 60), r.randint(2, 15)
        return (f"A tank holds {tank} liters. "
                f"A pipe fills it at {fill} liters per minute while a leak drains {leak} liters per minute. "
                "How long does it take to fill the empty tank?")

    def t17(r):
        n, boxes, per, item = r.choice(NAMES), r.randint(3, 15), r.randint(6, 24), r.choice(ITEMS)
        return (f"{n} packs {boxes} boxes with {per} {item} each and gives away {r.randint(1, boxes - 1)} full boxes. "
                f"How many {item} does {n} still have?")

    def t18(r):
        a, b = r.randint(12, 200), r.randint(12, 200)
        return f"What are the greatest common divisor and the least common multiple of {a} and {b}?"

    def t19(r):
        side = r.randint(2, 25)
        return f"A cube has edges of {side} cm. What are its volume and its surface area?"

    def t20(r):
        minutes, laps = r.randint(20, 90), r.randint(5, 30)
        return (f"A runner completes {laps} laps of a {r.choice((200, 400, 800))} meter track in {minutes} minutes. "
                "What is the runner's average speed in meters per minute?")

    return (t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15, t16, t17, t18, t19, t20)


def math_problem(rng: random.Random) -> str:
    """One word problem of a template drawn by `rng`, its numbers drawn by `rng` too.

    Example:
        >>> math_problem(random.Random(0)) == math_problem(random.Random(0))
        True
    """
    return rng.choice(_templates())(rng)
