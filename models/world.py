"""A synthetic recommendation world, deterministic from a seed, whose structure attention can find.

Topics are the hidden cause of everything: each post and each author belongs to one topic; each
user likes two topics. A user's history is mostly posts from their topics (liked, clicked, dwelt
on) with a few off-topic ones (skipped or marked not interested). A candidate is engaged when its
topic is one of the user's — so the only way to score it is to look back at the history for posts
of the same topic, which is what a candidate's attention row in the trunk then shows.

User hashes are random ids with no signal: the ranker must read the history, as phoenix does.

    world = World(seed=0)
    batch, labels = world.sample(layout, batch=64, seed=1)   # RecsysBatch, WorldLabels
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .recsys import ACTIONS, RecsysBatch, RecsysConfig, SequenceLayout

# The world's users take 8 of the original's 19 actions (runners.ACTIONS), in the original's order:
# the demo ranker predicts these 8. Per action, how likely a user takes it on a post they engage
# with / skip.
_ENGAGED_ACTIONS = {"favorite_score": 1.0, "reply_score": 0.2, "repost_score": 0.3, "click_score": 0.9,
                    "profile_click_score": 0.2, "share_score": 0.1, "dwell_score": 0.8,
                    "not_interested_score": 0.0}
_SKIPPED_ACTIONS = {"favorite_score": 0.0, "reply_score": 0.0, "repost_score": 0.0, "click_score": 0.15,
                    "profile_click_score": 0.0, "share_score": 0.0, "dwell_score": 0.1,
                    "not_interested_score": 0.4}
WORLD_ACTIONS = tuple(a for a in ACTIONS if a in _ENGAGED_ACTIONS)
ENGAGED_ACTION = "favorite_score"   # fires exactly when the user engages: the ranking target


@dataclass
class WorldLabels:
    actions: torch.Tensor            # [B, C, num_actions] multi-hot float: what the user did
    engaged: torch.Tensor            # [B, C] bool (== actions[..., favorite_score])
    history_topics: torch.Tensor     # [B, S] long, -1 at padded slots
    candidate_topics: torch.Tensor   # [B, C] long, -1 at padded slots


@dataclass(frozen=True)
class World:
    """Posts, authors and users over `num_topics` topics; all tables drawn from `seed`."""
    seed: int = 0
    num_topics: int = 8
    num_posts: int = 240
    num_authors: int = 48
    favourite_topics: int = 2
    on_topic_history: float = 0.8     # share of history drawn from the user's topics
    on_topic_candidates: float = 0.5  # share of candidates drawn from the user's topics
    label_noise: float = 0.03         # engagement flips with this probability
    hash_vocab_size: int = 256
    num_product_surfaces: int = 4

    def __post_init__(self):
        if self.num_topics < self.favourite_topics + 1:
            raise ValueError(f"num_topics: got {self.num_topics}; allowed: more than favourite_topics "
                             f"({self.favourite_topics}), so off-topic posts exist")
        g = torch.Generator().manual_seed(int(self.seed))
        P, A, V = self.num_posts, self.num_authors, self.hash_vocab_size
        # two hashes per post / author, drawn with collisions as real hash embeddings have them;
        # the pair is what tells two posts apart. 0 is the padding hash.
        object.__setattr__(self, "post_hashes", torch.randint(1, V, (P, 2), generator=g))
        object.__setattr__(self, "author_hashes", torch.randint(1, V, (A, 2), generator=g))
        object.__setattr__(self, "author_topic", torch.arange(A) % self.num_topics)
        # a post's author writes about the post's topic
        post_author = torch.randint(0, A, (P,), generator=g)
        object.__setattr__(self, "post_author", post_author)
        object.__setattr__(self, "post_topic", self.author_topic[post_author])

    def recsys_config(self, transformer) -> RecsysConfig:
        return RecsysConfig(transformer, action_names=WORLD_ACTIONS, hash_vocab_size=self.hash_vocab_size,
                            num_product_surfaces=self.num_product_surfaces)

    def _posts_of(self, topics: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """One random post of each requested topic. topics: any shape long -> same shape."""
        onehot = self.post_topic[None, :] == topics.reshape(-1, 1)               # [N, P]
        scores = torch.rand(onehot.shape, generator=g) * onehot                 # pick uniformly
        return scores.argmax(-1).view(topics.shape)

    def _actions(self, engaged: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """engaged [...] bool -> [..., num_actions] multi-hot."""
        p_eng = torch.tensor([_ENGAGED_ACTIONS[a] for a in WORLD_ACTIONS])
        p_skip = torch.tensor([_SKIPPED_ACTIONS[a] for a in WORLD_ACTIONS])
        p = torch.where(engaged[..., None], p_eng, p_skip)
        return (torch.rand(p.shape, generator=g) < p).float()

    def sample(self, layout: SequenceLayout, batch: int = 1, seed: int = 0) -> tuple[RecsysBatch, WorldLabels]:
        if layout.num_user != 1:
            raise ValueError(f"num_user: got {layout.num_user}; allowed: 1 (the world has one user token)")
        g = torch.Generator().manual_seed(int(seed) * 7919 + int(self.seed))
        B, S, C, K = batch, layout.num_history, layout.num_candidates, self.num_topics
        # each user: `favourite_topics` distinct topics
        favourites = torch.rand(B, K, generator=g).argsort(-1)[:, :self.favourite_topics]   # [B, F]
        is_fav = torch.zeros(B, K, dtype=torch.bool).scatter_(1, favourites, True)          # [B, K]

        def draw_topics(n, on_topic_share):
            pick_fav = torch.rand(B, n, generator=g) < on_topic_share
            fav = favourites.gather(1, torch.randint(0, self.favourite_topics, (B, n), generator=g))
            # an off-topic draw is any topic the user does not like
            off_scores = torch.rand(B, n, K, generator=g).masked_fill(is_fav[:, None, :], -1.0)
            return torch.where(pick_fav, fav, off_scores.argmax(-1))                        # [B, n]

        hist_topics, cand_topics = draw_topics(S, self.on_topic_history), draw_topics(C, self.on_topic_candidates)
        hist_posts, cand_posts = self._posts_of(hist_topics, g), self._posts_of(cand_topics, g)
        hist_engaged = is_fav.gather(1, hist_topics)
        flip = torch.rand(B, C, generator=g) < self.label_noise
        cand_engaged = is_fav.gather(1, cand_topics) ^ flip
        hist_actions = self._actions(hist_engaged, g)
        cand_actions = self._actions(cand_engaged, g)

        hist_post_h = self.post_hashes[hist_posts]                                 # [B, S, 2]
        hist_author_h = self.author_hashes[self.post_author[hist_posts]]
        cand_post_h = self.post_hashes[cand_posts]
        cand_author_h = self.author_hashes[self.post_author[cand_posts]]
        surf_h = torch.randint(0, self.num_product_surfaces, (B, S), generator=g)
        surf_c = torch.randint(0, self.num_product_surfaces, (B, C), generator=g)
        # user ids are random: no shortcut around the history
        user_h = torch.randint(1, self.hash_vocab_size, (B, 2), generator=g)

        hist_topics, cand_topics = hist_topics.clone(), cand_topics.clone()
        if layout.history_padding:
            pad = slice(S - layout.history_padding, S)
            hist_post_h[:, pad] = 0
            hist_author_h[:, pad] = 0
            hist_actions[:, pad] = 0
            hist_topics[:, pad] = -1
        if layout.candidate_padding:
            pad = slice(C - layout.candidate_padding, C)
            cand_post_h[:, pad] = 0
            cand_author_h[:, pad] = 0
            cand_topics[:, pad] = -1
            cand_actions[:, pad] = 0
        batch_ = RecsysBatch(user_h, hist_post_h, hist_author_h, hist_actions, surf_h,
                             cand_post_h, cand_author_h, surf_c)
        labels = WorldLabels(cand_actions, cand_actions[..., WORLD_ACTIONS.index(ENGAGED_ACTION)].bool(),
                             hist_topics, cand_topics)
        return batch_, labels
