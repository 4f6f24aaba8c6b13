"""The shipped synthetic patient cases of the `doctor` environment (task `doctor`).

Each case: (diagnosis, the patient's opening complaint, hidden facts). A fact is (the sentence the
patient says, its keywords): a question reveals the fact when one of the keywords starts a word of
the question (`doctor.revealed_facts`). Written for the environment, not clinical advice; no
diagnosis name contains another, so an answer naming one is never read as naming a second.
"""
from __future__ import annotations

CASES: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("influenza", "I have felt awful since yesterday.", [
        ("I have a high fever.", "fever temperature hot"), ("My muscles ache all over.", "ache muscle body pain"),
        ("I have a dry cough.", "cough"), ("It came on suddenly over a few hours.", "sudden start began when onset")]),
    ("migraine", "I keep getting bad headaches.", [
        ("The pain is on one side of my head and throbs.", "side where location throb"),
        ("Bright light makes it worse.", "light bright vision eye"),
        ("I feel sick to my stomach during an attack.", "nausea sick vomit stomach"),
        ("Each attack lasts most of a day.", "long last duration hour")]),
    ("appendicitis", "I have a pain in my belly.", [
        ("The pain moved to the lower right side.", "right side where location lower"),
        ("I have a mild fever.", "fever temperature"), ("I have no appetite.", "appetite eat hungry food"),
        ("It hurts more when I walk or cough.", "walk move worse cough")]),
    ("asthma", "I get short of breath.", [
        ("I wheeze, especially at night.", "wheez night noise sound"),
        ("Cold air and exercise set it off.", "exercise cold trigger sport"),
        ("I had eczema as a child.", "eczema skin rash child allerg"), ("My chest feels tight.", "chest tight")]),
    ("pneumonia", "I have been coughing for a week.", [
        ("I cough up green phlegm.", "phlegm sputum mucus colour color"),
        ("I have a high fever with chills.", "fever chill temperature"),
        ("It hurts on the right side of my chest when I breathe in.", "chest breath pain hurt"),
        ("I get out of breath walking upstairs.", "breath stairs walk short")]),
    ("urinary tract infection", "It burns when I pee.", [
        ("I need to go to the toilet very often.", "often frequen toilet"),
        ("My urine is cloudy and smells strong.", "urine cloud smell colour color"),
        ("I have a dull ache low in my belly.", "belly abdomen pain ache stomach"),
        ("I have no fever.", "fever temperature")]),
    ("type 2 diabetes", "I am always thirsty.", [
        ("I pass urine many times a day.", "urine toilet pee often"), ("I have lost weight without trying.", "weight"),
        ("I feel tired all the time.", "tired energy fatigue sleep"),
        ("Cuts on my feet heal slowly.", "heal cut wound feet foot skin")]),
    ("hypothyroidism", "I feel tired and cold all the time.", [
        ("I have gained weight.", "weight"), ("My skin is dry.", "skin dry"),
        ("I am constipated.", "constipat bowel stool toilet"), ("My hair is thinning.", "hair")]),
    ("hyperthyroidism", "My heart keeps racing.", [
        ("I have lost weight even though I eat a lot.", "weight eat appetite"),
        ("My hands shake.", "shake tremor hand"),
        ("I feel hot when others are cold.", "hot heat warm temperature sweat"),
        ("I feel anxious and cannot sleep.", "anxi sleep nervous mood")]),
    ("iron deficiency anemia", "I get tired very easily.", [
        ("I look pale.", "pale colour color skin"), ("My periods are very heavy.", "period menstru bleed"),
        ("I get breathless on stairs.", "breath stairs"), ("I crave ice to chew.", "crave ice eat appetite")]),
    ("acid reflux", "I have a burning feeling in my chest.", [
        ("It is worse after big meals.", "meal eat food after"),
        ("It is worse when I lie down.", "lie lying night bed position"),
        ("I taste something sour in my mouth.", "taste sour mouth"), ("Antacids help.", "antacid medic help tablet")]),
    ("gallstones", "I get pain in my upper belly.", [
        ("The pain is under my right ribs.", "right rib where location"),
        ("It comes after fatty meals.", "meal fat eat food"),
        ("The pain lasts a few hours then stops.", "long last hour duration"),
        ("The pain spreads to my right shoulder.", "shoulder spread radiat back")]),
    ("kidney stones", "I have terrible pain in my side.", [
        ("The pain comes in waves.", "wave constant come"), ("The pain spreads to my groin.", "groin spread radiat"),
        ("There is blood in my urine.", "blood urine pee"),
        ("I cannot keep still with the pain.", "still move position restless")]),
    ("gout", "My big toe is very painful.", [
        ("The toe is red and swollen.", "red swell swollen look"),
        ("It started overnight.", "start began sudden when night"),
        ("I drank a lot of beer at a party.", "beer alcohol drink"),
        ("Even the bed sheet touching it hurts.", "touch sheet tender")]),
    ("rheumatoid arthritis", "My joints hurt.", [
        ("My hands are stiff for over an hour each morning.", "stiff morning"),
        ("The same joints hurt on both sides.", "both side symmetr"),
        ("My knuckles are swollen.", "swell swollen knuckle"), ("I feel tired and run down.", "tired fatigue energy")]),
    ("osteoarthritis", "My knee hurts.", [
        ("It hurts more at the end of the day.", "day evening worse time"),
        ("It is stiff for a few minutes after sitting.", "stiff sit morning"),
        ("The knee creaks when I bend it.", "creak crack noise bend sound"), ("I am 68 years old.", "age old")]),
    ("shingles", "I have a painful rash.", [
        ("The rash is a band on one side of my body.", "side where band location"),
        ("It started as a burning pain before the rash.", "burn before start began first"),
        ("The rash has small blisters.", "blister look bubble"),
        ("I had chickenpox as a child.", "chickenpox child past")]),
    ("chickenpox", "My daughter has spots.", [
        ("The spots are itchy blisters.", "itch blister look"),
        ("The spots are all over her body.", "where body spread"), ("She has a mild fever.", "fever temperature"),
        ("Several children at her school have the same.", "school contact others children")]),
    ("conjunctivitis", "My eye is red.", [
        ("It feels gritty.", "gritty feel sand"),
        ("There is sticky discharge in the morning.", "discharge sticky morning crust"),
        ("My vision is normal.", "vision see sight blur"), ("Both eyes are affected.", "both eyes other")]),
    ("middle ear infection", "My son keeps pulling at his ear.", [
        ("He has a fever.", "fever temperature"), ("He has had a cold this week.", "cold runny nose sneez"),
        ("He does not hear well.", "hear deaf"), ("He cries at night.", "night sleep cry")]),
    ("strep throat", "I have a sore throat.", [
        ("I have a high fever.", "fever temperature"), ("My tonsils have white spots.", "tonsil white spots look"),
        ("The glands in my neck are swollen.", "gland neck swell swollen lump"), ("I have no cough.", "cough")]),
    ("common cold", "I have a runny nose.", [
        ("I sneeze a lot.", "sneez"), ("My throat is a bit scratchy.", "throat"),
        ("I have no fever.", "fever temperature"),
        ("It started two days ago and is getting better.", "start began when better days")]),
    ("hay fever", "My nose keeps running.", [
        ("My eyes itch.", "eye itch"), ("It happens every spring.", "spring season year when time"),
        ("It is worse outside on sunny days.", "outside sun weather garden"),
        ("I have no fever.", "fever temperature")]),
    ("deep vein thrombosis", "My calf is swollen.", [
        ("Only my left leg is swollen.", "left both one which leg"),
        ("I flew home from a long trip last week.", "flight flew travel trip plane"),
        ("The calf is warm and tender.", "warm tender touch hot"),
        ("I take the contraceptive pill.", "pill medic contracept tablet")]),
    ("angina", "I get chest pain.", [
        ("It comes on when I walk uphill.", "walk exercise hill when effort"),
        ("It goes away after a few minutes of rest.", "rest stop minute away"),
        ("It feels like pressure on my chest.", "feel pressure squeez like"),
        ("I have smoked for thirty years.", "smok cigarette tobacco")]),
    ("myocardial infarction", "I have crushing chest pain.", [
        ("It started an hour ago while I was resting.", "start began when rest hour"),
        ("The pain spreads to my left arm.", "arm spread radiat"),
        ("I am sweating and feel sick.", "sweat sick nausea"),
        ("I have high blood pressure.", "pressure blood hypertens")]),
    ("panic disorder", "I suddenly feel like I cannot breathe.", [
        ("My heart pounds during the attacks.", "heart pound racing palpitat"),
        ("Attacks last about ten minutes.", "long last minute duration"),
        ("I feel I am going to die.", "die fear afraid scared"),
        ("Tests of my heart were normal.", "test ecg result")]),
    ("depression", "I have been feeling low.", [
        ("I no longer enjoy my hobbies.", "enjoy hobb interest fun"),
        ("I wake up very early and cannot get back to sleep.", "sleep wake night"),
        ("It has lasted two months.", "long last month when since"),
        ("I have little appetite.", "appetite eat food weight")]),
    ("irritable bowel syndrome", "My stomach is often upset.", [
        ("I swing between diarrhoea and constipation.", "diarrh constipat bowel stool"),
        ("I feel bloated.", "bloat gas wind"), ("Going to the toilet relieves the pain.", "toilet reliev better"),
        ("There is no blood in my stool.", "blood")]),
    ("sinusitis", "My face hurts.", [
        ("The pain is over my cheeks and forehead.", "where cheek forehead location"),
        ("It is worse when I bend forward.", "bend forward lean worse"),
        ("I have thick yellow mucus from my nose.", "mucus nose discharge snot yellow"),
        ("I had a cold two weeks ago.", "cold recent")]),
    ("tension headache", "I have a headache.", [
        ("It feels like a tight band around my head.", "band tight like where"),
        ("It is worse when I am stressed.", "stress worse work"), ("Light does not bother me.", "light bright"),
        ("I have no nausea.", "nausea sick vomit")]),
    ("lyme disease", "I have a strange rash.", [
        ("The rash looks like a bullseye.", "look bullseye ring shape circle"),
        ("I went hiking in the woods.", "hik wood forest outdoor"),
        ("I found a tick on my leg.", "tick bite insect bug"), ("My joints ache.", "joint ache")]),
]
