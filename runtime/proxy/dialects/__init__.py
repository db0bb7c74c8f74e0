"""The four API dialects of the capture proxy.

How the proxy uses them (see base.py for the contract, routes.py for routing):

    route = match_route(request.url.path, request.query_params)      # None -> 404
    dialect = dialect_for(route)                                      # errors before this: dialect_for(None)
    key = session_key(request.headers, request.query_params)         # None/unknown -> 401 in `dialect`
    parsed = dialect.parse_request(await request.body(), route)       # DialectError -> dialect.render_error
    if training: reject_constrained_decoding(parsed.canonical)
    body = parsed.canonical.upstream_body() | proxy's own fields (logprobs, return_token_ids, ...)
    if parsed.operation is Operation.COUNT_TOKENS: tokenize, then dialect.render_count_tokens(n)
    elif parsed.stream: StreamingResponse(dialect.render_stream(chunks, parsed), "text/event-stream")
    else: JSONResponse(dialect.render_response(Completion.model_validate(json), parsed))
"""
