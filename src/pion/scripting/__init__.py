"""Lua scripting (EVAL, EVALSHA, SCRIPT) on a real Lua 5.1 runtime (lupa), as Redis 7
defines it; the commands are ``pion.commands.scripting``.

Reading order:

1. ``runtime.py``: the script cache, running a script atomically on the loop, and
   ``redis.call`` through the command table.
2. ``sandbox.py``: the Lua state and its prelude (what a script sees, read-only
   globals, no way to Python).
3. ``convert.py``: replies to Lua values and a script's value to the reply.
4. ``libs.py``: cjson, struct, bit and math.random's generator.
5. ``functions.py``: FUNCTION LOAD's libraries (part of the dataset) and FUNCTION
   DUMP's payload.
"""
