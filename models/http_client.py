"""One pooled HTTP client per event loop, shared by every session's LLM and TTS requests.

Making an ``httpx.AsyncClient`` builds an SSL context, 20–35 ms of CPU. Made per request on the event
loop, it held every other session's paced tokens, audio and RTP that long: one such stall in an
answer is a σ8 of ~17 ms, out of LST's Silver tier. Made once, in a worker thread, and kept, a request
costs only its own bytes, and keep-alive saves the connect as well. Requests pass their own timeouts.
"""

from __future__ import annotations

import asyncio
import weakref

import httpx

_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


async def shared_client() -> httpx.AsyncClient:
    """The running loop's client (made off the loop the first time; a closed one is made again)."""
    loop = asyncio.get_running_loop()
    client = _CLIENTS.get(loop)
    if client is None or client.is_closed:
        made = await asyncio.to_thread(httpx.AsyncClient)
        client = _CLIENTS.get(loop)  # another request may have made one meanwhile
        if client is None or client.is_closed:
            _CLIENTS[loop] = client = made
        else:
            await made.aclose()
    return client


async def close_shared_client() -> None:
    """Close the running loop's client, if it has one (at server shutdown)."""
    client = _CLIENTS.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.aclose()
