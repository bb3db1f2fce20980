"""The Agents SDK's `output_type` against SmolLM2-135M served by ignis: how many runs end
with a parsed `final_output`, over HTTP and over the socket.

    python experiments/agents_output_type.py [--runs 10] [--http-only]

Ten cities, one run each per transport, at the embedded model's served defaults
(configs/model/smollm2-135m.yaml: greedy, frequency_penalty 0.5, 512 output tokens).
The grammar holds every answer to the schema; what can still go wrong is a string the
model never closes (cut by the output limit: the response ends `incomplete` and the SDK
raises). Prints one line per run, then the count.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from pydantic import BaseModel

from serving import ServerProcess

CITIES = ["Lyon", "Paris", "Berlin", "Madrid", "Rome", "Vienna", "Oslo", "Lisbon", "Prague", "Dublin"]


class City(BaseModel):
    city: str
    country: str
    population: int


async def run(base_url: str, city: str, socket: bool) -> tuple[str, float]:
    from agents import Agent, ModelSettings, Runner, set_tracing_disabled
    from agents.models.openai_provider import OpenAIProvider
    from agents.models.openai_responses import OpenAIResponsesModel
    from agents.run import RunConfig
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    settings = ModelSettings(temperature=0.0, frequency_penalty=0.5, max_tokens=512)
    instructions = "Answer with the city, its country and its population."
    if socket:
        agent = Agent(name="cities", instructions=instructions, output_type=City, model="fake-model", model_settings=settings)
        config = RunConfig(model_provider=OpenAIProvider(openai_client=client, use_responses=True,
                                                         use_responses_websocket=True))
    else:
        agent = Agent(name="cities", instructions=instructions, output_type=City,
                      model=OpenAIResponsesModel("fake-model", client), model_settings=settings)
        config = None
    t0 = time.perf_counter()
    try:
        result = await Runner.run(agent, f"Describe {city}.", run_config=config)
        outcome = f"parsed {result.final_output!r}"
    except Exception as exc:  # noqa: BLE001 - a failed run is a data point
        outcome = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
    finally:
        await client.close()
    return outcome, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--http-only", action="store_true")
    args = ap.parse_args()
    server = ServerProcess(model="smollm2", max_num_seqs=4)
    try:
        for socket in ([False] if args.http_only else [False, True]):
            parsed = 0
            for city in (CITIES * 10)[: args.runs]:
                outcome, seconds = asyncio.run(run(server.base_url, city, socket))
                parsed += outcome.startswith("parsed")
                print(f"{'socket' if socket else 'http  '} {city:8s} {seconds:6.1f} s  {outcome}", flush=True)
            print(f"{'socket' if socket else 'http'}: {parsed} of {args.runs} runs parsed", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
