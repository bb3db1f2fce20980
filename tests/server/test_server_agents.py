"""The Agents SDK pointed at ignis: OpenAIResponsesModel (HTTP) and
OpenAIResponsesWSModel (the socket), a two-turn run and a streamed run each."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.server.server_harness import KEY

agents = pytest.importorskip("agents")


def test_agents_sdk_over_http_and_socket(srv):
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel, OpenAIResponsesWSModel

    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=srv.base_url + "/v1", api_key=KEY, max_retries=0)
        # A stop string ends the random model's answer early, as a completed response.
        settings = ModelSettings(max_tokens=200, temperature=0, extra_body={"stop": [" "]})
        for model in (OpenAIResponsesModel("tiny", client), OpenAIResponsesWSModel("tiny", client)):
            agent = Agent(name="a", instructions="Be brief.", model=model, tools=[get_weather],
                          model_settings=settings)
            first = await Runner.run(agent, "hi")
            assert isinstance(first.final_output, str)
            second = await Runner.run(agent, first.to_input_list() + [{"role": "user", "content": "more"}])
            usage = second.raw_responses[-1].usage
            assert usage.input_tokens > first.raw_responses[-1].usage.input_tokens
            assert usage.input_tokens_details.cached_tokens > 0
            streamed = Runner.run_streamed(agent, "stream please")
            async for _ in streamed.stream_events():
                pass
            assert isinstance(streamed.final_output, str)
        await client.close()

    asyncio.run(main())
