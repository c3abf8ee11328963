"""The one MCP server behind both transports (the SDK's low-level ``Server``): tools/list,
tools/call, and the ``promptsched://`` resources, each call answered through the gateway the
transport gives for the request (the token's owner's); and serving it over stdio."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from promptsched.mcpserver import tools
from promptsched.mcpserver.gateway import Gateway, Refused

if TYPE_CHECKING:
    import mcp_types as types
    from mcp.server.context import ServerRequestContext
    from mcp.server.lowlevel import Server

NAME = "promptsched"
INSTRUCTIONS = (
    "promptsched runs prompts on a schedule and keeps their outputs. Use create_schedule for "
    "something recurring (or one-shot at an instant), place_followup to keep a promise later "
    "under a key of yours (placing it again is safe), preview_schedule to check an expression "
    "first, and show_run or the promptsched://runs/{id}/output resource to read a result. "
    "Everything you see and change belongs to the owner of the token you were given."
)
RUN_OUTPUT = "promptsched://runs/{id}/output"
SCHEDULE_RUNS = "promptsched://schedules/{id}/runs"
_RUN_OUTPUT = re.compile(r"^promptsched://runs/([1-9][0-9]{0,18})/output$")
_SCHEDULE_RUNS = re.compile(r"^promptsched://schedules/([1-9][0-9]{0,18})/runs$")
RECENT_RUNS = 20  # a schedule's runs resource
LISTED = 50  # schedules, and succeeded runs, offered by resources/list
RESOURCE_NOT_FOUND = -32002  # the MCP specification's code for a resource that is not there

GatewayFor = Callable[["ServerRequestContext[Any, Any]"], Gateway]


def build(gateway_for: GatewayFor, *, version: str = "") -> Server[Any]:
    """The server; ``gateway_for`` gives the gateway a request is answered through."""
    from mcp.server.lowlevel import Server

    handlers = Handlers(gateway_for)
    return Server(
        NAME,
        version=version,
        title="promptsched",
        instructions=INSTRUCTIONS,
        on_list_tools=handlers.list_tools,
        on_call_tool=handlers.call_tool,
        on_list_resources=handlers.list_resources,
        on_list_resource_templates=handlers.list_templates,
        on_read_resource=handlers.read_resource,
    )


class Handlers:
    """The server's request handlers (the ``mcp`` SDK is imported only when one runs)."""

    def __init__(self, gateway_for: GatewayFor) -> None:
        self.gateway_for = gateway_for

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        import mcp_types as types

        return types.ListToolsResult(tools=[_tool(spec) for spec in tools.TOOLS])

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        import mcp_types as types

        spec = tools.BY_NAME.get(params.name)
        if spec is None:
            known = ", ".join(tools.BY_NAME)
            return _error(f"No tool named {params.name[:80]!r}; the tools are: {known}.")
        arguments = dict(params.arguments or {})
        gateway = self.gateway_for(ctx)
        try:
            query, body = spec.split(arguments)
            answer = await gateway.call(spec.operation, query, body)
            data = await spec.shape(gateway, arguments, answer) if spec.shape else answer.data
        except Refused as refused:
            return _error(tools.refusal_text(spec, refused, arguments))
        return types.CallToolResult(
            content=[types.TextContent(text=tools.to_text(data))],
            structured_content=data if isinstance(data, dict) else None,
        )

    async def list_resources(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        import mcp_types as types
        from mcp.shared.exceptions import MCPError

        gateway = self.gateway_for(ctx)
        try:
            schedules = await gateway.call("listSchedules", {"limit": LISTED})
            runs = await gateway.call("listRuns", {"status": "succeeded", "limit": LISTED})
        except Refused as refused:
            raise MCPError(types.INVALID_REQUEST, refused.message) from None
        found = [
            types.Resource(
                uri=SCHEDULE_RUNS.format(id=row["id"]), name=f"schedule-{row['id']}-runs",
                title=f"Recent runs of {row['name']}", mime_type="application/json",
                description=f"the last {RECENT_RUNS} runs of schedule {row['id']}, newest first",
            )
            for row in schedules.data["items"]
        ] + [
            types.Resource(
                uri=RUN_OUTPUT.format(id=row["id"]), name=f"run-{row['id']}-output",
                title=f"Output of run {row['id']} (schedule {row['schedule_id']})",
                mime_type="text/plain", description=f"finished {row.get('finished_at')}",
            )
            for row in runs.data["items"]
        ]  # fmt: skip
        return types.ListResourcesResult(resources=found)

    async def list_templates(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        import mcp_types as types

        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    uri_template=RUN_OUTPUT, name="run-output", title="A run's output",
                    mime_type="text/plain",
                    description="the output a run produced (its text; a monitor's JSON answer)",
                ),
                types.ResourceTemplate(
                    uri_template=SCHEDULE_RUNS, name="schedule-runs",
                    title="A schedule's recent runs", mime_type="application/json",
                    description=f"the last {RECENT_RUNS} runs of a schedule with their "
                    "outputs, newest first",
                ),
            ]
        )  # fmt: skip

    async def read_resource(
        self, ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        import mcp_types as types
        from mcp.shared.exceptions import MCPError

        uri = str(params.uri)
        try:
            text, mime = await self._read(uri, self.gateway_for(ctx))
        except Refused as refused:
            code = RESOURCE_NOT_FOUND if refused.status == 404 else types.INVALID_REQUEST
            raise MCPError(code, f"{uri[:200]}: {refused.message}") from None
        except LookupError as missing:
            raise MCPError(RESOURCE_NOT_FOUND, str(missing.args[0])) from None
        content = types.TextResourceContents(uri=uri, mime_type=mime, text=text)
        return types.ReadResourceResult(contents=[content])

    async def _read(self, uri: str, gateway: Gateway) -> tuple[str, str]:
        """The resource's text and type; LookupError when there is nothing to read there."""
        if match := _RUN_OUTPUT.match(uri):
            run = (await gateway.call("getRun", {"id": int(match[1])})).data
            if run["output"] is None:
                raise LookupError(
                    f"run {run['id']} has no output (it is {run['status']}); read it again once "
                    "it succeeded"
                )
            return run["output"], "text/plain"
        if match := _SCHEDULE_RUNS.match(uri):
            query = {"schedule_id": int(match[1]), "limit": RECENT_RUNS}
            page = (await gateway.call("listRuns", query)).data
            if not page["items"]:  # none yet, or not a schedule of this owner's: which?
                await gateway.call("getSchedule", {"id": int(match[1])})
            return tools.to_text(page["items"]), "application/json"
        raise LookupError(
            f"no such resource: {uri[:200]!r}; the resources are {RUN_OUTPUT} and {SCHEDULE_RUNS}"
        )


def _tool(spec: tools.ToolSpec) -> types.Tool:
    import mcp_types as types

    annotations = types.ToolAnnotations(
        title=spec.title,
        read_only_hint=spec.read_only,
        destructive_hint=spec.destructive if not spec.read_only else None,
        idempotent_hint=spec.idempotent,
        open_world_hint=False,
    )
    return types.Tool(
        name=spec.name,
        title=spec.title,
        description=spec.description,
        input_schema=spec.schema,
        annotations=annotations,
    )


def _error(text: str) -> types.CallToolResult:
    import mcp_types as types

    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


async def serve_stdio(gateway: Gateway, *, version: str = "") -> None:
    """Serve on this process's stdin and stdout until the client closes them."""
    from mcp.server.stdio import stdio_server

    server = build(lambda ctx: gateway, version=version)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
