"""The true capacity of the instrument's virtual M/M/c queue (Erlang C), for the capacity search's tests and
benchmark: what a search on `servers=c+service_ms=S` should find under a TTFT SLO of ttft_ms + wait."""

from __future__ import annotations

import math

from scipy import optimize


def erlang_c(servers: int, offered: float) -> float:
    """The probability that an arrival waits (offered load a = rate x mean service time, in erlangs)."""
    if offered >= servers:
        return 1.0
    term, total = 1.0, 1.0
    for k in range(1, servers):
        term *= offered / k
        total += term
    last = term * offered / servers / (1 - offered / servers)
    return last / (total + last)


def mmc_attainment(rate: float, servers: int, service_s: float, wait_limit_s: float) -> float:
    """Share of requests whose wait is within `wait_limit_s`: 1 - C(c, a) exp(-(c mu - lambda) t)."""
    mu = 1.0 / service_s
    if rate >= servers * mu:
        return 0.0
    return 1.0 - erlang_c(servers, rate * service_s) * math.exp(-(servers * mu - rate) * wait_limit_s)


def mmc_capacity(servers: int, service_s: float, wait_limit_s: float, target: float) -> float:
    """The arrival rate at which attainment equals `target` (attainment falls as the rate grows)."""
    top = servers / service_s
    return float(
        optimize.brentq(lambda r: mmc_attainment(r, servers, service_s, wait_limit_s) - target, 1e-9, top * (1 - 1e-9))
    )
