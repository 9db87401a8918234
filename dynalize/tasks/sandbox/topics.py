"""The sandbox's topics: 130 short topic names, each with three nouns that belong to it.

A reply is on-topic when it names its topic and uses the topic's own nouns (see gold.py). The
train / held-out split is a seeded shuffle of this fixed list; prompt ids depend on the topic
only, so they stay the same whatever the split.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

# topic name: its nouns. Thirteen families of ten topics; no noun is another topic's name.
_TOPICS = """
the sea: waves, salt, gulls
the river: current, pebbles, banks
a lake: reeds, ducks, ripples
the rain: drops, puddles, umbrellas
a waterfall: spray, cliffs, roar
the harbor: ships, docks, ropes
a storm: lightning, gales, shutters
the beach: sand, shells, towels
a fountain: coins, statues, splashes
a swamp: frogs, mud, mosquitoes
the mountain: peaks, trails, eagles
the desert: dunes, cactus, heat
the forest: pines, moss, mushrooms
a valley: streams, farms, orchards
a meadow: flowers, grass, butterflies
the jungle: vines, parrots, monkeys
a cave: bats, darkness, echoes
the hills: slopes, sheep, fences
an island: palms, coral, lagoons
a volcano: lava, ash, smoke
the moon: craters, glow, phases
the stars: constellations, sparkle, telescopes
the sun: warmth, rays, noon
a cloud: shapes, vapor, shade
the wind: gusts, kites, leaves
the night: crickets, lamps, sleep
a sunrise: horizon, birdsong, dew
a rainbow: colors, arcs, prisms
thunder: rumbles, flashes, echoing
the sky: birds, planes, clouds
winter: ice, scarves, sleds
summer: sunshine, picnics, swimming
autumn: pumpkins, rakes, acorns
spring: blossoms, buds, robins
snow: flakes, snowmen, mittens
fog: haze, foghorns, dampness
a heatwave: fans, sweat, lemonade
frost: crystals, chill, glitter
a breeze: curtains, sails, coolness
the harvest: wheat, barns, baskets
the city: streets, traffic, neon
a market: stalls, vendors, fruit
a train station: platforms, tickets, travelers
the library: books, shelves, librarians
a bridge: rivets, cables, pillars
a museum: paintings, fossils, guides
a cafe: cups, pastries, chatter
the subway: tunnels, crowds, rails
a tower: stairs, bells, views
the park: benches, pigeons, paths
the kitchen: pots, spices, ovens
a garden: roses, soil, seeds
an old house: floorboards, dust, portraits
the attic: boxes, cobwebs, trunks
a window: glass, frames, sunlight
a fireplace: logs, flames, embers
a bedroom: pillows, blankets, posters
the porch: swings, steps, chairs
the yard: lawn, hedges, sprinklers
a balcony: plants, railings, sunsets
a cat: whiskers, purring, paws
a dog: leashes, bones, tails
the horse: saddles, hooves, stables
the owl: feathers, hooting, branches
a fox: dens, tracks, cunning
the whale: songs, oceans, spouts
the bees: hives, pollen, buzzing
a wolf: packs, howls, moonlight
the deer: antlers, fawns, clearings
a rabbit: carrots, burrows, ears
bread: crust, flour, loaves
coffee: beans, mugs, steam
tea: kettles, teacups, herbs
soup: bowls, broth, spoons
apples: cores, cider, trees
cheese: milk, crackers, rinds
chocolate: cocoa, wrappers, sweetness
honey: jars, combs, nectar
rice: grains, paddies, chopsticks
oranges: peels, juice, segments
music: melodies, rhythm, notes
a piano: pedals, chords, ivory
a guitar: strings, frets, picks
painting: brushes, canvas, easels
dance: moves, spins, partners
poetry: verses, rhymes, poets
a choir: voices, hymns, harmony
the theater: stages, actors, applause
a drum: beats, sticks, parades
a violin: bows, rosin, concerts
friendship: laughter, trust, loyalty
courage: fear, heroes, battles
memory: photographs, moments, scents
kindness: gifts, smiles, strangers
patience: waiting, queues, calmness
hope: wishes, candles, tomorrow
silence: stillness, pauses, hush
grief: tears, loss, comfort
joy: giggles, celebrations, cheers
curiosity: puzzles, discoveries, experiments
a carpenter: wood, saws, nails
a baker: dough, aprons, cakes
a teacher: lessons, chalk, students
a farmer: tractors, fields, cows
a fisherman: nets, hooks, boats
a doctor: patients, medicine, bandages
a sailor: knots, anchors, voyages
a potter: clay, kilns, vases
a gardener: shovels, hoses, tulips
a tailor: needles, thread, fabric
a journey: roads, miles, companions
a map: routes, legends, borders
a bicycle: spokes, helmets, chains
a ship: decks, masts, cargo
an old letter: ink, envelopes, handwriting
a clock: hands, ticking, gears
a lantern: wicks, oil, flickers
a suitcase: clothes, zippers, stickers
a compass: arrows, north, magnets
a key: locks, doors, rings
childhood: toys, playgrounds, scrapes
a birthday: balloons, presents, cards
the first day of school: backpacks, classrooms, nerves
a holiday: trips, postcards, relaxation
old age: wrinkles, wisdom, grandchildren
a wedding: vows, gowns, bouquets
a festival: fireworks, banners, costumes
a game: rules, players, dice
a dream: visions, mysteries, flying
a secret: rumors, diaries, hiding
"""


@dataclass(frozen=True)
class Topic:
    """One topic: its name as prompts write it, and the nouns that belong to it."""

    name: str
    nouns: tuple[str, ...]

    @property
    def core(self) -> str:
        """The name without its article: what a reply must say to name the topic."""
        return re.sub(r"^(the|a|an) ", "", self.name)

    @property
    def words(self) -> frozenset[str]:
        """The topic's own words: those of its name and its nouns."""
        return frozenset(self.core.split()) | frozenset(self.nouns)

    @property
    def id(self) -> str:
        """A stable id, from the name only."""
        return "sandbox-" + self.core.replace(" ", "-")


def _parse(text: str) -> list[Topic]:
    topics = []
    for line in text.strip().splitlines():
        name, _, nouns = line.partition(":")
        topics.append(Topic(name.strip(), tuple(n.strip() for n in nouns.split(","))))
    return topics


ALL_TOPICS: list[Topic] = _parse(_TOPICS)
_BY_NAME = {t.name.lower(): t for t in ALL_TOPICS} | {t.core.lower(): t for t in ALL_TOPICS}


def find_topic(name: str) -> Topic | None:
    """The topic named `name` (with or without its article), or None for an unknown topic."""
    return _BY_NAME.get(name.strip().lower())


def split_topics(n_train: int, n_eval: int, seed: int = 0) -> tuple[list[Topic], list[Topic]]:
    """Disjoint train and held-out topic lists: a seeded shuffle, cut in two."""
    if n_train + n_eval > len(ALL_TOPICS):
        raise ValueError(f"the sandbox has {len(ALL_TOPICS)} topics: n_train + n_eval = {n_train + n_eval} is too many")
    order = list(ALL_TOPICS)
    random.Random(seed).shuffle(order)
    return order[:n_train], order[n_train:n_train + n_eval]
