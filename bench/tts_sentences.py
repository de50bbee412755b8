"""A fixed set of answer-like sentences for bench/tts.py (the WER baseline of spoken answers)."""

SENTENCES: tuple[str, ...] = (
    "Sure, I can help with that.",
    "The meeting starts at 10:30 tomorrow morning.",
    "Paris is the capital of France, and it is known for the Eiffel Tower.",
    "Water boils at 100 degrees Celsius at sea level.",
    "You should drink about two liters of water every day.",
    "The train to Boston leaves from platform 4 in twenty minutes.",
    "Your order of 3 books will cost $42.50 including shipping.",
    "Light from the sun takes about eight minutes to reach the earth.",
    "I would recommend taking a short walk after lunch.",
    "The first computer program was written in the 1840s by Ada Lovelace.",
    "It will be sunny this afternoon, with a high of 25 degrees.",
    "Please remember to bring your passport and your ticket.",
    "The library closes at 9 pm on weekdays and at noon on Sundays.",
    "A healthy adult heart beats between sixty and one hundred times a minute.",
    "Turn left at the next corner, then walk straight for two blocks.",
    "About 70% of the earth's surface is covered by water.",
    "The museum opened in 1995 and now has over two million visitors a year.",
    "Dr. Smith will see you on Monday, the 3rd of June.",
    "If you feel tired, try going to bed half an hour earlier.",
    "That is a great question, and the short answer is yes.",
)
