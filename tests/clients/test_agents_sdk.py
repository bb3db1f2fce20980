"""The Agents SDK, unmodified: an Agent with a Python function tool, run by `Runner.run`
against the scripted model over HTTP (OpenAIResponsesModel) and over the socket (the
provider's websocket transport), reaching the final answer after the tool call."""

from __future__ import annotations

import asyncio

import openai
import pytest

from server_harness import KEY

agents = pytest.importorskip("agents")


def weather_tool(calls: list[str]) -> object:
    """A Python `get_weather` function tool that records the cities it is called with."""
    from agents import function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    return get_weather


def test_agent_calls_a_python_tool_over_http_and_the_socket(scripted_server, spy):
    from agents import Agent, ModelSettings, Runner
    from agents.items import ToolCallItem, ToolCallOutputItem
    from agents.models.openai_provider import OpenAIProvider
    from agents.models.openai_responses import OpenAIResponsesModel
    from agents.run import RunConfig

    calls: list[str] = []
    get_weather = weather_tool(calls)

    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=scripted_server.base_url + "/v1", api_key=KEY, max_retries=0)
        http_agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather],
                           model=OpenAIResponsesModel("scripted", client), model_settings=ModelSettings())
        socket_agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model="scripted")
        socket = RunConfig(model_provider=OpenAIProvider(openai_client=client, use_responses=True,
                                                         use_responses_websocket=True))
        for agent, config in ((http_agent, None), (socket_agent, socket)):
            calls.clear()
            spy["frames"].clear()
            result = await Runner.run(agent, "What is the weather in Paris?", run_config=config)
            assert calls == ["Paris"]
            kinds = [type(i) for i in result.new_items]
            assert ToolCallItem in kinds and ToolCallOutputItem in kinds
            assert result.final_output == "It is sunny in Paris."  # the script's answer to the tool's result
            assert len(result.raw_responses) == 2
            assert result.raw_responses[1].usage.input_tokens_details.cached_tokens > 0
            assert len(spy["frames"]) == (0 if config is None else 2)  # the socket carried both turns
        await client.close()

    asyncio.run(main())


def test_agent_with_tool_choice_required(scripted_server):
    """`ModelSettings(tool_choice="required")`: ignis forces the call's start (the script's
    reply is that call anyway, so it completes); the SDK then resets tool_choice (its
    default) and the answer follows. And a named tool the model would not call: the
    response fails, and the SDK says so."""
    from agents import Agent, ModelSettings, Runner
    from agents.models.openai_responses import OpenAIResponsesModel

    calls: list[str] = []
    get_weather = weather_tool(calls)

    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=scripted_server.base_url + "/v1", api_key=KEY, max_retries=0)
        agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather],
                      model=OpenAIResponsesModel("scripted", client),
                      model_settings=ModelSettings(tool_choice="required"))
        result = await Runner.run(agent, "What is the weather in Paris?")
        assert calls == ["Paris"] and result.final_output == "It is sunny in Paris."
        first = result.raw_responses[0]
        assert [o.type for o in first.output if o.type == "function_call"] == ["function_call"]
        # "Say hi" is answered "Hi!" by the script: under a named tool_choice the forced
        # start overrides it, the script's "Hi!" then makes the call malformed, and the
        # SDK gets response.failed (never a plain answer passing for a call).
        from agents.exceptions import ModelBehaviorError

        named = Agent(name="weather", instructions="Use the tool.", tools=[get_weather],
                      model=OpenAIResponsesModel("scripted", client),
                      model_settings=ModelSettings(tool_choice="get_weather"))
        calls.clear()
        with pytest.raises(ModelBehaviorError, match="did not produce a valid call to the required tool get_weather"):
            await Runner.run(named, "Say hi")
        assert calls == []
        await client.close()

    asyncio.run(main())
