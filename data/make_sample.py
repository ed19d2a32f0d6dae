"""Write data/sample: a small invented dataset in exactly the layout of the official release.

Six users, 20 domains of affinities and short interaction summaries, a few single- and
multi-domain tasks each. Everything here was written for this project. The JSON files are
committed; rerun `python data/make_sample.py` after editing this script.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "sample"
USERS = 6
SUMMARY_CHARS = (300, 600)  # short on purpose: the sample runs on a CPU with a tiny model

DEMOGRAPHICS = [
    dict(
        age="25-34 years old",
        gender="Female",
        employment_status="Working full-time",
        education="University Masters Degree",
        marital_status="Never been married",
        english_proficiency="Fluent",
        ethnicity="East Asian",
        religion="Buddhist",
        birth_country="Japan",
        reside_country="United Kingdom",
    ),
    dict(
        age="55-64 years old",
        gender="Male",
        employment_status="Retired",
        education="Completed Secondary",
        marital_status="Married",
        english_proficiency="Native speaker",
        ethnicity="White",
        religion="N/A",
        birth_country="United States",
        reside_country="United States",
    ),
    dict(
        age="18-24 years old",
        gender="Non-binary",
        employment_status="Full-time student",
        education="Some University",
        marital_status="Never been married",
        english_proficiency="Native speaker",
        ethnicity="Mixed",
        religion="Prefer not to say",
        birth_country="Australia",
        reside_country="Australia",
    ),
    dict(
        age="35-44 years old",
        gender="Male",
        employment_status="Self-employed",
        education="University Bachelors Degree",
        marital_status="Married",
        english_proficiency="Fluent",
        ethnicity="Black",
        religion="Muslim",
        birth_country="Nigeria",
        reside_country="Canada",
    ),
    dict(
        age="45-54 years old",
        gender="Female",
        employment_status="Working part-time",
        education="Vocational Training",
        marital_status="Divorced",
        english_proficiency="Intermediate",
        ethnicity="Hispanic or Latino",
        religion="Christian",
        birth_country="Mexico",
        reside_country="Spain",
    ),
    dict(
        age="65-74 years old",
        gender="Male",
        employment_status="Retired",
        education="University Doctorate",
        marital_status="Widowed",
        english_proficiency="Native speaker",
        ethnicity="South Asian",
        religion="Hindu",
        birth_country="India",
        reside_country="India",
    ),
]

# domain -> preference type -> one value per user (a list for multi-valued preferences).
AFFINITIES: dict[str, dict[str, tuple]] = {
    "Alarm": {
        "Wake-up Time": ("6:45 AM", "5:30 AM", "9:00 AM", "6:00 AM", "7:30 AM", "5:00 AM"),
        "Alarm Sound": (
            "soft piano",
            "classic radio news",
            "bass-heavy electronic track",
            "gentle chime",
            "birdsong",
            "temple bell",
        ),
        "Snooze Habit": (
            "takes one 5-minute snooze",
            "never snoozes",
            "snoozes three times",
            "does not snooze on weekdays",
            "takes one 10-minute snooze",
            "never snoozes",
        ),
    },
    "Books": {
        "Favourite Genres": (
            ["science fiction", "graphic novels"],
            ["westerns", "military history"],
            ["queer fiction", "fantasy"],
            ["business", "biographies"],
            ["romance", "historical fiction"],
            ["classic literature", "philosophy"],
        ),
        "Favourite Authors": (
            ["Ursula K. Le Guin", "Haruki Murakami"],
            ["Louis L'Amour", "Larry McMurtry"],
            ["Becky Chambers", "Madeline Miller"],
            ["Chinua Achebe", "Walter Isaacson"],
            ["Isabel Allende", "Carlos Ruiz Zafon"],
            ["R. K. Narayan", "Leo Tolstoy"],
        ),
        "Reading Format": ("ebook", "paperback", "audiobook", "audiobook", "paperback", "hardcover"),
    },
    "Buses": {
        "Preferred Bus Operators": (
            ["city night buses"],
            ["Greyhound"],
            ["tram and bus network"],
            ["Calgary Transit"],
            ["EMT Valencia"],
            ["state transport buses"],
        ),
        "Seat Preference": (
            "upper deck front",
            "aisle",
            "any free seat",
            "near the door",
            "window",
            "front, near the driver",
        ),
        "Travel Time": ("late evening", "mid-morning", "late night", "rush hour", "afternoon", "early morning"),
    },
    "Calendar": {
        "Event Reminder Lead Time": ("30 minutes", "1 day", "10 minutes", "2 hours", "1 hour", "1 day"),
        "Calendar View": ("weekly", "monthly", "daily agenda", "weekly", "daily agenda", "monthly"),
        "Scheduling Habits": (
            ["blocks focus time", "no meetings after 6 PM"],
            ["plans around grandchildren"],
            ["colour-codes lectures", "last-minute plans"],
            ["books client calls in the morning", "keeps Fridays light"],
            ["shift-based week"],
            ["fixed daily walk", "weekly family call"],
        ),
    },
    "Events": {
        "Event Types": (
            ["art exhibitions", "indie gigs"],
            ["rodeos", "country concerts"],
            ["electronic music festivals", "drag shows"],
            ["business conferences", "football matches"],
            ["flamenco shows", "local fiestas"],
            ["classical music recitals", "book readings"],
        ),
        "Ticket Budget": (
            "up to 60 GBP",
            "up to 150 USD",
            "under 40 AUD",
            "up to 200 CAD",
            "up to 50 EUR",
            "up to 2000 INR",
        ),
        "Seating Preference": (
            "standing near the front",
            "reserved seats with easy access",
            "general admission",
            "aisle seats",
            "balcony",
            "front rows",
        ),
    },
    "Finance": {
        "Banking Channels": (
            ["mobile app"],
            ["branch visits", "phone banking"],
            ["mobile app"],
            ["online banking", "mobile app"],
            ["online banking"],
            ["branch visits"],
        ),
        "Risk Tolerance": ("moderate", "low", "high", "moderate", "low", "very low"),
        "Budgeting Style": (
            "a monthly spreadsheet",
            "fixed cash envelopes",
            "no formal budget",
            "separate business and personal accounts",
            "weekly spending limits",
            "a monthly plan based on the pension",
        ),
    },
    "Flights": {
        "Preferred Airlines": (
            ["Japan Airlines", "British Airways"],
            ["Southwest", "American Airlines"],
            ["Jetstar"],
            ["Air Canada", "WestJet"],
            ["Iberia", "Vueling"],
            ["Air India", "IndiGo"],
        ),
        "Seat Class": ("economy", "economy plus", "economy", "business", "economy", "business"),
        "Seat Location": ("window", "aisle", "window", "aisle", "window", "aisle near the front"),
    },
    "Games": {
        "Game Genres": (
            ["puzzle games"],
            ["card games"],
            ["roguelikes", "rhythm games"],
            ["strategy games"],
            ["word games"],
            ["chess"],
        ),
        "Platforms": (
            ["Nintendo Switch"],
            ["tablet"],
            ["PC", "Steam Deck"],
            ["mobile"],
            ["mobile"],
            ["desktop browser"],
        ),
        "Play Style": (
            "short and relaxing",
            "solo and unhurried",
            "competitive and online",
            "quick, on commutes",
            "one daily puzzle",
            "slow correspondence games",
        ),
    },
    "Hotels": {
        "Hotel Chains": (
            ["Premier Inn", "citizenM"],
            ["Hilton", "Best Western"],
            ["YHA hostels"],
            ["Marriott"],
            ["NH Hotels", "Melia"],
            ["Taj Hotels"],
        ),
        "Amenities": (
            ["fast Wi-Fi", "quiet rooms"],
            ["free parking", "breakfast"],
            ["shared kitchen"],
            ["business centre", "halal dining options", "gym"],
            ["pool", "breakfast"],
            ["lift access", "vegetarian restaurant"],
        ),
        "Location Preference": (
            "near a train station",
            "with easy highway access",
            "in the city centre",
            "near the airport",
            "in the old town",
            "in a quiet area near the centre",
        ),
    },
    "Media": {
        "News Topics": (
            ["design", "technology"],
            ["local politics", "weather"],
            ["climate", "music culture"],
            ["business", "African affairs"],
            ["health", "Spanish politics"],
            ["science", "cricket"],
        ),
        "Media Format": ("newsletters", "TV news", "short videos", "podcasts", "radio", "printed newspapers"),
        "Preferred Outlets": (
            ["The Guardian"],
            ["local TV station"],
            ["triple j"],
            ["The Globe and Mail", "BBC"],
            ["El Pais"],
            ["The Hindu"],
        ),
    },
    "Messaging": {
        "Messaging Apps": (
            ["LINE", "WhatsApp"],
            ["SMS"],
            ["Discord", "Instagram"],
            ["WhatsApp", "Slack"],
            ["WhatsApp"],
            ["WhatsApp", "email"],
        ),
        "Message Tone": ("casual with emoji", "plain and short", "playful", "professional", "warm", "formal"),
        "Notification Preference": (
            "silent during work hours",
            "loud",
            "for mentions only",
            "on for everything",
            "vibration only",
            "loud",
        ),
    },
    "Movies": {
        "Movie Genres": (
            ["animation", "science fiction"],
            ["westerns", "war films"],
            ["horror", "indie comedy"],
            ["thrillers", "documentaries"],
            ["romantic comedies", "Spanish-language dramas"],
            ["Indian classics", "historical dramas"],
        ),
        "Favourite Directors": (
            ["Hayao Miyazaki", "Denis Villeneuve"],
            ["Clint Eastwood"],
            ["Jordan Peele", "Taika Waititi"],
            ["Christopher Nolan"],
            ["Pedro Almodovar", "Alfonso Cuaron"],
            ["Satyajit Ray"],
        ),
        "Viewing Preference": (
            "evening screenings at the cinema",
            "streaming at home",
            "cheap weekday cinema tickets",
            "streaming at home",
            "the cinema with friends",
            "matinee screenings",
        ),
    },
    "Music": {
        "Music Genres": (
            ["city pop", "indie rock"],
            ["classic country", "blues"],
            ["techno", "hyperpop"],
            ["afrobeats", "jazz"],
            ["flamenco", "Latin pop"],
            ["Hindustani classical", "old film songs"],
        ),
        "Favourite Artists": (
            ["Mariya Takeuchi", "Phoebe Bridgers"],
            ["Willie Nelson", "B.B. King"],
            ["Charli XCX", "Fred again.."],
            ["Burna Boy", "Miles Davis"],
            ["Rosalia", "Juanes"],
            ["Pandit Bhimsen Joshi", "Lata Mangeshkar"],
        ),
        "Listening Context": (
            "while working",
            "on the porch",
            "at the gym and parties",
            "while driving",
            "while cooking",
            "during morning riyaz practice",
        ),
    },
    "Rental Cars": {
        "Car Type": (
            "compact",
            "full-size pickup",
            "whatever is cheapest",
            "SUV",
            "small hatchback",
            "sedan with a driver",
        ),
        "Rental Companies": (
            ["Enterprise"],
            ["Hertz"],
            ["any low-cost company"],
            ["Avis", "Enterprise"],
            ["Europcar"],
            ["Zoomcar"],
        ),
        "Insurance Preference": ("full cover", "basic", "basic", "full cover", "full cover", "full cover"),
    },
    "Restaurants": {
        "Cuisine Preference": (
            ["Japanese", "Middle Eastern"],
            ["Tex-Mex", "steakhouse"],
            ["Vietnamese", "Ethiopian"],
            ["West African", "Lebanese"],
            ["Mexican", "Mediterranean"],
            ["South Indian", "Gujarati"],
        ),
        "Dietary Restrictions": (
            ["vegetarian"],
            ["low sodium"],
            ["vegan"],
            ["halal"],
            ["no restrictions"],
            ["vegetarian", "no onion or garlic"],
        ),
        "Price Range": ("mid-range", "mid-range", "budget", "upscale", "budget", "mid-range"),
    },
    "Services": {
        "Service Types": (
            ["bike repair"],
            ["plumbing", "lawn care"],
            ["phone repair"],
            ["accounting", "car servicing"],
            ["hairdresser"],
            ["home nursing", "electrician"],
        ),
        "Provider Qualities": (
            ["eco-friendly"],
            ["long-established", "local"],
            ["cheap"],
            ["licensed", "fast"],
            ["Spanish-speaking", "flexible"],
            ["trusted by neighbours"],
        ),
        "Appointment Time": (
            "Saturday morning",
            "weekday morning",
            "any weekday afternoon",
            "early morning",
            "weekday mornings",
            "late morning",
        ),
    },
    "Shopping": {
        "Favourite Brands": (
            ["Muji", "Uniqlo"],
            ["Levi's", "Carhartt"],
            ["thrift stores"],
            ["Hugo Boss", "Apple"],
            ["Zara", "Mango"],
            ["Fabindia"],
        ),
        "Shopping Channel": ("online", "in store", "at second-hand markets", "online", "in store", "in store"),
        "Budget Preference": (
            "quality over price",
            "value for money",
            "as cheap as possible",
            "premium",
            "discount hunting",
            "value for money",
        ),
    },
    "Sports": {
        "Favourite Sports": (
            ["tennis"],
            ["American football", "baseball"],
            ["roller derby"],
            ["football", "ice hockey"],
            ["football"],
            ["cricket"],
        ),
        "Favourite Teams": (
            ["none"],
            ["Dallas Cowboys", "Texas Rangers"],
            ["none"],
            ["Calgary Flames", "Arsenal"],
            ["Valencia CF"],
            ["India national cricket team"],
        ),
        "Engagement Style": (
            "plays weekly",
            "watches every game",
            "plays in a league",
            "watches highlights",
            "watches with friends",
            "follows scores on the radio",
        ),
    },
    "Train": {
        "Seat Class": ("standard", "first class", "standard", "first class", "standard", "AC 2-tier sleeper"),
        "Departure Time Preference": (
            "early morning",
            "mid-morning",
            "evening",
            "early morning",
            "afternoon",
            "morning",
        ),
        "Onboard Needs": (
            ["table seat", "power socket"],
            ["extra legroom"],
            ["bike space"],
            ["Wi-Fi", "quiet carriage"],
            ["luggage space"],
            ["lower berth", "vegetarian meals"],
        ),
    },
    "Travel": {
        "Destination Types": (
            ["design cities", "onsen towns"],
            ["national parks"],
            ["beach towns", "music festivals"],
            ["business hubs", "family visits"],
            ["coastal villages"],
            ["pilgrimage sites", "hill stations"],
        ),
        "Trip Pace": ("relaxed", "slow", "packed", "efficient", "relaxed", "slow"),
        "Travel Companions": (
            "solo",
            "with spouse",
            "with friends",
            "solo for work, family for holidays",
            "with her daughter",
            "with his son's family",
        ),
    },
}

# Interaction summaries, written in third person like the release's; {type} slots take the user's values.
SUMMARIES: dict[str, str] = {
    "Alarm": "The user sets alarms through the assistant most evenings. They wake at {Wake-up Time} and like the "
    "alarm to play {Alarm Sound}. When it comes to snoozing, the user {Snooze Habit}. When the assistant "
    "once picked a harsh buzzer, the user asked to switch back straight away. They also like a short "
    "spoken confirmation of the alarm time, and they ask for weekend alarms to be switched off unless "
    "they say otherwise.",
    "Books": "The user talks about books with the assistant and mostly reads {Favourite Genres}. They keep "
    "coming back to {Favourite Authors} and prefer the {Reading Format} format. They liked it when the "
    "assistant explained why a suggestion fit their taste, and disliked long lists of bestsellers. "
    "Twice they asked for a reading order for a series, and they usually want to know a book's length "
    "before starting it.",
    "Buses": "The user checks bus times with the assistant, usually with {Preferred Bus Operators}. They travel "
    "mostly at this time: {Travel Time}. Seat preference: {Seat Preference}. They asked to be warned "
    "about delays and got annoyed when a route change was not mentioned. They prefer the assistant to "
    "give the next two departures and the walking time to the stop rather than a full timetable.",
    "Calendar": "The user manages their calendar by voice and text. They want reminders {Event Reminder Lead Time} "
    "before events and a {Calendar View} view. Their habits: {Scheduling Habits}. They once asked the "
    "assistant to stop moving events without asking first. When two events clash, they want both "
    "shown with a suggestion, and they like a short summary of the next day every evening.",
    "Events": "The user asks the assistant about things to do, mostly {Event Types}. They keep tickets {Ticket Budget} "
    "and prefer {Seating Preference}. They appreciated suggestions with dates and prices up front, and "
    "skipped events that were far from public transport. After one sold-out show, they asked the "
    "assistant to mention how quickly tickets tend to go and whether a waiting list exists.",
    "Finance": "The user handles money questions with the assistant and banks through {Banking Channels}. Their risk "
    "tolerance is {Risk Tolerance}; their budgeting approach: {Budgeting Style}. They asked for plain "
    "explanations of fees and did not want product pitches. They check their balance before large "
    "purchases and once asked the assistant to set up an alert when spending in a category gets high.",
    "Flights": "The user books flights with the assistant, preferring {Preferred Airlines}. They fly {Seat Class} "
    "and want a seat by the {Seat Location}. They liked the assistant comparing two or three options "
    "and disliked itineraries with long layovers. They usually travel with one carry-on bag, ask about "
    "baggage rules before paying, and want the booking reference repeated at the end.",
    "Games": "The user chats about games now and then. They enjoy {Game Genres} on {Platforms}, and their play "
    "style is {Play Style}. They asked for recommendations without spoilers and were not interested in "
    "games with heavy in-app purchases. They like hearing how long a game takes to finish and whether "
    "it can be paused at any time, since their free time comes in short blocks.",
    "Hotels": "The user has booked hotels through the assistant, favouring {Hotel Chains}. They care about "
    "{Amenities} and prefer to stay {Location Preference}. They complained once when a suggested hotel "
    "turned out to be far from where they needed to be. They read recent reviews about cleanliness "
    "and noise, and they prefer free cancellation even if the room costs a little more.",
    "Media": "The user follows the news with the assistant's help, mostly on {News Topics}. They prefer {Media Format} "
    "and trust {Preferred Outlets}. They like short summaries with a link to the full story and dislike "
    "sensational headlines. In the morning they ask for a brief round-up, and they sometimes ask the "
    "assistant to explain the background of a story they have not followed.",
    "Messaging": "The user sends messages through the assistant on {Messaging Apps}. Their tone is {Message Tone} "
    "and notifications should be {Notification Preference}. They asked the assistant to read drafts "
    "back before sending anything to a group. They often dictate replies while busy, and they want "
    "names checked carefully because two of their contacts share a first name.",
    "Movies": "The user looks for films with the assistant, leaning towards {Movie Genres}. Favourite directors "
    "include {Favourite Directors}, and they prefer {Viewing Preference}. They liked suggestions that "
    "mentioned running time and where to watch. They avoid trailers that give too much away and once "
    "asked the assistant to keep a list of films to watch later.",
    "Music": "The user asks the assistant for music, mainly {Music Genres}. They love {Favourite Artists} and listen "
    "{Listening Context}. They enjoyed playlists that mixed favourites with a few new finds and skipped "
    "anything too repetitive. They sometimes ask about an artist's background or a song's story, and "
    "they like to hear when a favourite releases something new.",
    "Rental Cars": "The user rented cars through the assistant a few times. Car type: {Car Type}. They go with "
    "{Rental Companies} and take {Insurance Preference} insurance. They wanted the total price "
    "including fees before confirming a booking. They care about the pick-up desk's opening hours "
    "and the fuel policy, and they once asked for a reminder on the morning the car was due back.",
    "Restaurants": "The user finds places to eat with the assistant. They enjoy {Cuisine Preference} food (dietary "
    "needs: {Dietary Restrictions}) and usually pick {Price Range} places. They were pleased when the "
    "assistant checked menus for suitable dishes before suggesting a table. They like to know "
    "about noise levels and whether booking is needed, and prefer places within easy reach.",
    "Services": "The user books local services through the assistant, such as {Service Types}. They look for "
    "providers that are {Provider Qualities} and prefer appointments at this time: {Appointment Time}. "
    "They asked for reviews and prices before committing. After one provider arrived late without "
    "notice, they asked the assistant to favour businesses that confirm appointments ahead of time.",
    "Shopping": "The user shops with the assistant's help and likes {Favourite Brands}. They shop {Shopping Channel} "
    "and their approach is {Budget Preference}. They asked the assistant to flag return policies and "
    "delivery times when comparing items. They dislike being shown too many options at once and "
    "prefer three good choices with a short note on why each fits.",
    "Sports": "The user talks sport with the assistant, mostly {Favourite Sports}. Teams they follow: {Favourite Teams}. "
    "The user {Engagement Style}. They like quick score updates and fixture reminders rather than long "
    "analysis. They once asked the assistant not to reveal results of a match they had recorded to "
    "watch later, and they appreciate short notes on injuries before big games.",
    "Train": "The user plans train journeys with the assistant, travelling {Seat Class} and leaving in the "
    "{Departure Time Preference}. Onboard they need {Onboard Needs}. They asked to be told about "
    "platform changes and cheaper advance fares. For longer trips they want connection times of at "
    "least twenty minutes, and they like the assistant to repeat the departure platform and time.",
    "Travel": "The user plans trips with the assistant, drawn to {Destination Types}. They prefer a {Trip Pace} "
    "pace and usually travel {Travel Companions}. They valued itineraries with free time built in and "
    "realistic travel times between stops. They ask about local customs and weather before leaving, "
    "and they prefer to book the main parts of a trip well in advance.",
}

# Domains each user is not interested in (interests 0); their tasks avoid these.
NOT_INTERESTED = [
    {"Games", "Sports", "Rental Cars", "Buses"},
    {"Games", "Train", "Buses", "Messaging"},
    {"Finance", "Hotels", "Flights", "Rental Cars", "Services"},
    {"Books", "Games", "Media"},
    {"Flights", "Sports", "Finance", "Games", "Buses", "Rental Cars"},
    {"Games", "Rental Cars", "Shopping", "Sports", "Messaging"},
]

# Single-domain task definitions: domain -> [(description, intent, goal, affinity types)], numbered from 1.
SD_TASKS: dict[str, list[tuple[str, str, str, list[str]]]] = {
    "Alarm": [
        (
            "The user wants an alarm for tomorrow morning that matches their usual wake-up time, sound and snooze habit.",
            "Set an alarm for tomorrow morning at your usual time, with the sound and snooze setting you like.",
            "An alarm is set for the next morning with the user's wake-up time, sound and snooze setting.",
            ["Wake-up Time", "Alarm Sound", "Snooze Habit"],
        ),
        (
            "The user needs a one-off early alarm for a special occasion and wants a sound they find pleasant.",
            "Set a one-off alarm earlier than usual for a special occasion, with a sound you like.",
            "A single, non-repeating alarm is set earlier than the usual time with the preferred sound.",
            ["Wake-up Time", "Alarm Sound"],
        ),
    ],
    "Books": [
        (
            "The user is looking for their next book and wants suggestions in their favourite genres and format.",
            "Find your next book to read in a genre you love and in the format you prefer.",
            "The user chooses a book in a preferred genre and obtains it in the preferred format.",
            ["Favourite Genres", "Reading Format"],
        ),
        (
            "The user wants a book similar to those of their favourite authors to give as a gift.",
            "Find a book by or similar to one of your favourite authors to give as a present.",
            "The user picks a gift book connected to a favourite author and knows where to buy it.",
            ["Favourite Authors", "Favourite Genres"],
        ),
    ],
    "Events": [
        (
            "The user wants something to do this weekend and asks for events they would enjoy within their budget.",
            "Find an event this weekend that you would enjoy, within your usual ticket budget.",
            "The user selects an event of a preferred type within budget and knows how to get tickets.",
            ["Event Types", "Ticket Budget"],
        ),
        (
            "The user wants to buy tickets for an upcoming event with their preferred kind of seating.",
            "Buy tickets for an upcoming event you are interested in, with the seating you prefer.",
            "Tickets for a suitable event are chosen in the user's preferred seating area and within budget.",
            ["Event Types", "Seating Preference", "Ticket Budget"],
        ),
    ],
    "Flights": [
        (
            "The user needs a return flight for an upcoming trip and wants options on preferred airlines and seats.",
            "Book a return flight for your next trip on an airline you like, in your usual class and seat.",
            "A return flight is booked on a preferred airline with the user's seat class and seat location.",
            ["Preferred Airlines", "Seat Class", "Seat Location"],
        ),
        (
            "The user's flight was cancelled and they need a new one as soon as possible.",
            "Your flight was cancelled; get rebooked on the earliest suitable alternative.",
            "The user is rebooked on an alternative flight that respects their class and seat preferences.",
            ["Preferred Airlines", "Seat Class"],
        ),
    ],
    "Hotels": [
        (
            "The user needs a hotel for a short stay and wants one with the amenities and location they value.",
            "Book a hotel for a two-night stay with the amenities and location you prefer.",
            "A hotel matching the user's amenities and location preferences is booked for two nights.",
            ["Hotel Chains", "Amenities", "Location Preference"],
        ),
        (
            "The user wants to compare a few hotels from chains they trust before deciding.",
            "Compare a few hotels from chains you trust and pick the best one for your dates.",
            "The user compares at least two suitable hotels and chooses one.",
            ["Hotel Chains", "Amenities"],
        ),
    ],
    "Movies": [
        (
            "The user wants a film to watch tonight that suits their taste and how they like to watch.",
            "Find a film to watch tonight that fits your taste and the way you like to watch films.",
            "The user picks a film in a preferred genre and knows where and when to watch it.",
            ["Movie Genres", "Viewing Preference"],
        ),
        (
            "The user wants to catch up on the work of a favourite director.",
            "Plan which films by one of your favourite directors to watch next and where to see them.",
            "The user has a short list of films by a favourite director and a way to watch the first one.",
            ["Favourite Directors", "Viewing Preference"],
        ),
    ],
    "Music": [
        (
            "The user wants a new playlist for a particular part of their day built around their taste.",
            "Get a playlist for the time you usually listen to music, built around genres and artists you like.",
            "A playlist mixing the user's preferred genres and artists is created for their listening context.",
            ["Music Genres", "Favourite Artists", "Listening Context"],
        ),
        (
            "The user wants to discover new artists similar to the ones they already love.",
            "Discover a few new artists similar to your favourites.",
            "The user receives new artist suggestions related to their favourites and saves at least one.",
            ["Favourite Artists", "Music Genres"],
        ),
    ],
    "Restaurants": [
        (
            "The user wants to book dinner for two at a restaurant that fits their diet, taste and budget.",
            "Book a table for two for dinner at a restaurant that fits your diet, taste and budget.",
            "A table for two is booked at a restaurant matching the user's cuisine, diet and price range.",
            ["Cuisine Preference", "Dietary Restrictions", "Price Range"],
        ),
        (
            "The user wants a quick lunch nearby that respects their dietary restrictions.",
            "Find a quick lunch spot nearby that respects your dietary needs.",
            "The user chooses a nearby lunch place with suitable dishes for their diet.",
            ["Dietary Restrictions", "Price Range"],
        ),
    ],
    "Shopping": [
        (
            "The user needs a new everyday jacket and wants options from brands and shops they like.",
            "Buy a new everyday jacket from a brand and kind of shop you like, within your usual budget.",
            "The user selects a jacket from a preferred brand or channel that fits their budget approach.",
            ["Favourite Brands", "Shopping Channel", "Budget Preference"],
        ),
        (
            "The user is looking for a birthday present for a friend and wants to stay within budget.",
            "Find a birthday present for a friend that fits how you like to shop and spend.",
            "A suitable present is chosen that respects the user's budget preference and shopping channel.",
            ["Budget Preference", "Shopping Channel"],
        ),
    ],
    "Train": [
        (
            "The user needs a train ticket for a day trip and wants their usual class and departure time.",
            "Book a train ticket for a day trip in your usual class, leaving at a time you like.",
            "A train ticket is booked in the user's seat class with a departure in their preferred time window.",
            ["Seat Class", "Departure Time Preference"],
        ),
        (
            "The user is making a long train journey and wants the trip to be comfortable.",
            "Plan a long train journey so that it is as comfortable as possible for you.",
            "A long-distance train is chosen that offers the user's onboard needs and preferred class.",
            ["Onboard Needs", "Seat Class"],
        ),
    ],
}

# Multi-domain task definitions: (domains, description, intent, goal, affinity types), numbered from 1.
MD_TASKS: list[tuple[list[str], str, str, str, list[str]]] = [
    (
        ["Events", "Restaurants"],
        "The user is planning an evening out: an event they would enjoy followed by dinner nearby.",
        "Plan an evening out with an event you would enjoy and dinner nearby that suits your diet.",
        "The user has tickets for a suitable event and a restaurant booking close to the venue.",
        ["Event Types", "Ticket Budget", "Cuisine Preference", "Dietary Restrictions"],
    ),
    (
        ["Flights", "Hotels"],
        "The user has a trip coming up and needs both a flight and a hotel that suit their preferences.",
        "Arrange the flight and the hotel for your upcoming trip.",
        "A flight on a preferred airline and a hotel with the user's preferred amenities and location are booked.",
        ["Preferred Airlines", "Seat Class", "Hotel Chains", "Amenities", "Location Preference"],
    ),
    (
        ["Movies", "Restaurants"],
        "The user wants a dinner-and-a-movie night that fits their tastes.",
        "Plan dinner and a movie for this weekend.",
        "The user has picked a film in a preferred genre and booked a suitable restaurant around the screening.",
        ["Movie Genres", "Viewing Preference", "Cuisine Preference", "Price Range"],
    ),
    (
        ["Train", "Hotels", "Events"],
        "The user wants a weekend trip by train to attend an event in another city, with an overnight stay.",
        "Plan a weekend trip by train to an event in another city, including a place to stay.",
        "Train tickets, a hotel night and event tickets are arranged in line with the user's preferences.",
        ["Seat Class", "Departure Time Preference", "Amenities", "Event Types"],
    ),
    (
        ["Alarm", "Music"],
        "The user wants to wake up to music they love instead of a plain alarm sound.",
        "Set your morning alarm to wake you with music you love.",
        "An alarm at the user's wake-up time plays music from their preferred genres or artists.",
        ["Wake-up Time", "Music Genres", "Favourite Artists"],
    ),
]

# Per user: city, devices, assigned SD task ids and MD task numbers.
PLANS = [
    (
        "London, United Kingdom",
        ("Smartphone", "Laptop"),
        ["SD-Restaurants-task-1", "SD-Movies-task-2", "SD-Train-task-1", "SD-Books-task-1"],
        [1, 4],
    ),
    (
        "Austin, United States",
        ("Tablet", "Smart Speaker"),
        ["SD-Alarm-task-1", "SD-Music-task-2", "SD-Hotels-task-1"],
        [2, 3],
    ),
    (
        "Melbourne, Australia",
        ("Smartphone",),
        ["SD-Music-task-1", "SD-Events-task-2", "SD-Shopping-task-1", "SD-Alarm-task-2"],
        [5, 1],
    ),
    (
        "Calgary, Canada",
        ("Laptop", "Smartphone", "Car"),
        ["SD-Flights-task-1", "SD-Hotels-task-2", "SD-Restaurants-task-2"],
        [2, 3],
    ),
    (
        "Valencia, Spain",
        ("Smartphone", "Tablet"),
        ["SD-Shopping-task-2", "SD-Books-task-2", "SD-Events-task-1", "SD-Train-task-2"],
        [3, 4],
    ),
    (
        "Pune, India",
        ("Desktop Computer", "Smart Speaker"),
        ["SD-Books-task-1", "SD-Music-task-1", "SD-Movies-task-1", "SD-Alarm-task-1"],
        [5, 4],
    ),
]
TIMES = ("Morning", "Afternoon", "Evening", "Night", "Early Morning", "Late Evening")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
ENVIRONMENTS = ("Quiet", "Noisy", "Commuting", "At home", "Outdoors", "Crowded")
DOMAINS = tuple(AFFINITIES)


def words(value: str | list[str]) -> str:
    """A preference value as prose: "a", "a and b", "a, b and c"."""
    if isinstance(value, str):
        return value
    return value[0] if len(value) == 1 else ", ".join(value[:-1]) + " and " + value[-1]


def profile(user: int) -> dict:
    affinities = {d: {t: values[user] for t, values in types.items()} for d, types in AFFINITIES.items()}
    interactions = {}
    for domain, template in SUMMARIES.items():
        text = template.format_map({t: words(v) for t, v in affinities[domain].items()})
        assert SUMMARY_CHARS[0] <= len(text) <= SUMMARY_CHARS[1], (user, domain, len(text))
        interactions[domain] = text
    return {
        "affinities": affinities,
        "demographics": {"user_id": f"user{user}", **DEMOGRAPHICS[user]},
        "interests": {d: int(d not in NOT_INTERESTED[user]) for d in DOMAINS},
        "interactions": interactions,
    }


def sd_definitions() -> dict[str, dict]:
    return {
        f"SD-{domain}-task-{n}": {
            "Task Number": n,
            "Task Description": desc,
            "User Intent": intent,
            "Task Goal": goal,
            "Relevant Affinity Types": types,
        }
        for domain, tasks in SD_TASKS.items()
        for n, (desc, intent, goal, types) in enumerate(tasks, 1)
    }


def md_definitions() -> dict[str, dict]:
    return {
        f"MD-task-{n}": {
            "Task Number": n,
            "Task Description": desc,
            "User Intent": intent,
            "Task Goal": goal,
            "Relevant Domains": domains,
            "Relevant Affinity Types": types,
        }
        for n, (domains, desc, intent, goal, types) in enumerate(MD_TASKS, 1)
    }


def assignments(user: int, task_ids: list[str], definitions: dict[str, dict], offset: int) -> dict:
    """tasks.json / tasks_md.json: each definition (minus its number) with the user's situation."""
    city, devices = PLANS[user][:2]
    entries = {}
    for i, task_id in enumerate(task_ids):
        k = offset + i
        definition = {key: v for key, v in definitions[task_id].items() if key != "Task Number"}
        situation = {
            "Location": city,
            "Device": devices[k % len(devices)],
            "Time of Day": TIMES[(user + k) % len(TIMES)],
            "Day of the Week": DAYS[(2 * user + k) % 7],
            "Environment": ENVIRONMENTS[(user + 2 * k) % len(ENVIRONMENTS)],
        }
        if task_id.startswith("SD-"):  # the release's key order differs between the two files
            domain = task_id.split("-")[1]
            entry = {**definition, "task_id": task_id, "situations": situation, "Relevant Domains": [domain]}
        else:
            entry = {**definition, "task_id": task_id, "situations": situation}
        assert not set(entry["Relevant Domains"]) & NOT_INTERESTED[user], (user, task_id)
        entries[f"Task {i + 1}"] = entry
    return entries


def write_json(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=4))  # the release: 4-space indent, ASCII, no final newline


def main() -> None:
    shutil.rmtree(ROOT, ignore_errors=True)
    sd, md = sd_definitions(), md_definitions()
    for domain in SD_TASKS:
        lines = [json.dumps(d) for tid, d in sd.items() if tid.startswith(f"SD-{domain}-task-")]
        (ROOT / "task" / domain).mkdir(parents=True)
        (ROOT / "task" / domain / "task.jsonl").write_text("\n".join(lines) + "\n")
    (ROOT / "task" / "Multi-Domain").mkdir(parents=True)
    (ROOT / "task" / "Multi-Domain" / "task.jsonl").write_text("\n".join(map(json.dumps, md.values())) + "\n")
    for user, (_, _, sd_ids, md_numbers) in enumerate(PLANS):
        folder = ROOT / "profile" / f"user{user}"
        write_json(folder / "profile.json", profile(user))
        write_json(folder / "tasks.json", assignments(user, sd_ids, sd, 0))
        write_json(folder / "tasks_md.json", assignments(user, [f"MD-task-{n}" for n in md_numbers], md, len(sd_ids)))
    print(f"wrote {ROOT}")


if __name__ == "__main__":
    main()
