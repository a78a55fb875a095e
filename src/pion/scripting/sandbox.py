"""The Lua state scripts run in: Lua 5.1 (``lupa.lua51``, the version Redis embeds),
locked down as Redis 7 locks its own.

What a script sees is what redis-server 7.0 leaves it: the base library without
``loadfile``, ``dofile``, ``print``, ``setfenv``, ``getfenv`` and ``newproxy``;
``string``, ``table``, ``math``, ``cjson``, ``struct``, ``bit`` and ``redis``. No
``os``, ``io``, ``debug``, ``package``, ``require`` or ``module``. The global table
and the library tables are read-only (``Attempt to modify a readonly table``), and
reading a global that does not exist is an error (``Script attempted to access
nonexistent global variable``), so one script cannot leave state for the next.

A function library's code (FUNCTION LOAD) runs once in a narrower sandbox, as
redis-server 7.0's: its globals are only ``redis`` with ``register_function``, ``log``,
the ``LOG_*`` levels and the version constants; the callbacks it registers later run
with a script's globals, without ``KEYS`` and ``ARGV`` (they get keys and args as
arguments).

The Python side is never reachable from Lua: the runtime is built without
``python.eval``/``python.builtins`` and the ``python`` table is removed, every
attribute access on a Python object from Lua is refused (:func:`_no_attributes`),
and the few Python functions the prelude holds (the command call, the libraries of
``pion.scripting.libs``, the clock of FUNCTION LOAD's time limit) are kept in locals
of the prelude, handed only Lua strings, numbers and tables, and return only those.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRELUDE", "new_runtime"]


def _no_attributes(obj: object, name: object, is_setting: bool) -> object:
    """lupa's attribute filter: no attribute of a Python object is ever reachable."""
    raise AttributeError("not accessible from Lua")


def new_runtime() -> Any:
    """A fresh Lua 5.1 state with the standard libraries, Lua strings as bytes."""
    from lupa import lua51

    return lua51.LuaRuntime(
        encoding=None,
        register_eval=False,
        register_builtins=False,
        unpack_returned_tuples=True,
        attribute_filter=_no_attributes,
    )


# Run once per state with the Python helpers as arguments; returns the functions the
# runtime calls (compile, run). Everything it keeps is a local (an upvalue), so a
# script can neither reach nor replace it.
PRELUDE = rb"""
local pycall, pylog, pysha1, pyrandom, pyseed, pyjson_enc, pyjson_dec, pystruct, pybit,
      version, version_num, pykilled, pynow = ...
local type, error, pairs, load, ipairs, tostring, select, rawget, rawset, setmetatable,
      getmetatable, loadstring, setfenv, pcall, xpcall, unpack =
      type, error, pairs, load, ipairs, tostring, select, rawget, rawset, setmetatable,
      getmetatable, loadstring, setfenv, pcall, xpcall, unpack
local dbg_getinfo, dbg_sethook = debug.getinfo, debug.sethook
local concat, floor = table.concat, math.floor
local G = _G
local os_clock = os.clock

local function err_table(line)
  -- redis's luaPushErrorBuff: "-CODE msg" or "msg" -> {err="CODE msg"}
  if line:sub(1, 1) == '-' then
    local sp = line:find(' ', 1, true)
    if sp then
      line = line:sub(2, sp - 1) .. ' ' .. line:sub(sp + 1)
    else
      line = 'ERR ' .. line:sub(2)
    end
  else
    line = 'ERR ' .. line
  end
  line = line:gsub('[\r\n]+$', '')
  return {err = line}
end

local function call(raise, ...)
  local n = select('#', ...)
  local argv = {...}
  for i = 1, n do
    local t = type(argv[i])
    if t == 'number' then
      argv[i] = tostring(argv[i])
      -- Lua formats numbers with %.14g, as redis does
    elseif t ~= 'string' then
      argv = nil
      break
    end
  end
  if n == 0 then
    local e = {err = 'ERR Please specify at least one argument for this redis lib call'}
    if raise then error(e) end
    return e
  end
  if argv == nil then
    local e = {err = 'ERR Lua redis lib command arguments must be strings or integers'}
    if raise then error(e) end
    return e
  end
  local ok, reply = pycall(argv, n)
  if not ok then
    if raise then error(reply) end
  end
  return reply
end

local redis = {}
-- redis.call raises from a C function (a fresh coroutine.wrap per lookup), as Redis's
-- does: a tail call into a Lua function would take the script's frame, and its line,
-- out of the error ("on @user_script:N.").
local cowrap = coroutine.wrap
local function call_raising(...)
  local r = call(true, ...)
  return r
end
redis.pcall = function(...)
  local r = call(false, ...)
  return r
end
redis.error_reply = function(msg)
  if type(msg) ~= 'string' then error({err = 'ERR wrong number or type of arguments'}) end
  if msg:sub(1, 1) ~= '-' then msg = '-' .. msg end
  return err_table(msg)
end
redis.status_reply = function(msg)
  if type(msg) ~= 'string' then error({err = 'ERR wrong number or type of arguments'}) end
  return {ok = msg}
end
redis.sha1hex = function(s)
  if type(s) ~= 'string' and type(s) ~= 'number' then
    error({err = 'ERR wrong number of arguments'})
  end
  return pysha1(tostring(s))
end
redis.setresp = function(v)
  if v ~= 2 and v ~= 3 then
    error({err = 'ERR RESP version must be 2 or 3.'})
  end
  pycall(nil, v)
end
redis.log = function(level, ...)
  if select('#', ...) == 0 then
    error({err = 'ERR redis.log() requires two arguments or more.'})
  end
  if type(level) ~= 'number' or level < 0 or level > 3 then
    error({err = 'ERR Invalid debug level.'})
  end
  local parts = {...}
  for i = 1, #parts do parts[i] = tostring(parts[i]) end
  pylog(level, concat(parts, ' '))
end
redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_NOTICE, redis.LOG_WARNING = 0, 1, 2, 3
redis.REDIS_VERSION = version
redis.REDIS_VERSION_NUM = version_num
redis.set_repl = function() end
redis.replicate_commands = function() return true end
redis.REPL_NONE, redis.REPL_AOF, redis.REPL_SLAVE, redis.REPL_REPLICA, redis.REPL_ALL =
  0, 1, 2, 2, 3
redis.breakpoint = function() return false end
redis.debug = function() end

math.random = function(m, n)
  local r = pyrandom()
  if m == nil then return r end
  if n == nil then
    if m < 1 then error('interval is empty', 2) end
    return floor(r * m) + 1
  end
  if m > n then error('interval is empty', 2) end
  return floor(r * (n - m + 1)) + m
end
math.randomseed = function(s) pyseed(floor(s or 0)) end

local cjson = {
  encode = function(v)
    local ok, s = pyjson_enc(v)
    if not ok then error(s, 2) end
    return s
  end,
  decode = function(s)
    if type(s) ~= 'string' then error('bad argument #1 to \'decode\' (string expected)', 2) end
    local ok, v = pyjson_dec(s)
    if not ok then error(v, 2) end
    return v
  end,
}
cjson.null = setmetatable({}, {__tostring = function() return 'null' end})
pyjson_enc(nil, function(x) return rawequal(x, cjson.null) end, cjson.null)

local struct = {}
for _, name in ipairs({'pack', 'unpack', 'size'}) do
  struct[name] = function(...)
    local res = {pystruct(name, {...}, select('#', ...))}
    if res[1] == false then error(res[2], 2) end
    return select(2, unpack(res))
  end
end

local bit = {}
for _, name in ipairs({'tobit', 'tohex', 'bnot', 'band', 'bor', 'bxor', 'lshift',
                       'rshift', 'arshift', 'rol', 'ror', 'bswap'}) do
  bit[name] = function(...)
    local ok, v = pybit(name, {...}, select('#', ...))
    if not ok then error(v, 2) end
    return v
  end
end

-- what a script sees: its own global table (the state's own stays as lupa needs it)
local env = {}
for _, name in ipairs({'assert', 'collectgarbage', 'error', 'gcinfo', 'getmetatable',
                       'ipairs', 'next', 'pairs', 'pcall', 'rawequal', 'rawget',
                       'select', 'setmetatable', 'tonumber', 'tostring', 'type',
                       'unpack', 'xpcall', '_VERSION'}) do
  env[name] = G[name]
end
-- Redis 7's pcall: an error table's message comes back as a string
local function pcall_result(n, ok, ...)
  if not ok then
    local e = ...
    if type(e) == 'table' and type(rawget(e, 'err')) == 'string' then
      return false, rawget(e, 'err')
    end
  end
  return ok, ...
end
env.pcall = function(f, ...)
  return pcall_result(select('#', ...), pcall(f, ...))
end
local readonly = setmetatable({}, {__mode = 'k'})
local function ro_error() error('Attempt to modify a readonly table', 2) end
local function proxy(t)
  local p = setmetatable({}, {__index = t, __newindex = ro_error, __metatable = false})
  readonly[p] = true
  return p
end
env.string, env.table, env.math = proxy(string), proxy(table), proxy(math)
env.coroutine = proxy(coroutine)
env.cjson, env.struct, env.bit = proxy(cjson), proxy(struct), proxy(bit)
env.redis = setmetatable({}, {
  __index = function(_, k)
    if k == 'call' then return cowrap(call_raising) end
    return redis[k]
  end,
  __newindex = ro_error,
  __metatable = false,
})
readonly[env.redis] = true
env.os = proxy({clock = os_clock})
local function checked_rawset(t, k, v)
  if readonly[t] then error({err = 'ERR Attempt to modify a readonly table'}) end
  local r = rawset(t, k, v)
  return r
end
local script_env = setmetatable({}, {
  __index = function(_, k)
    if k == 'rawset' then return cowrap(checked_rawset) end
    local v = env[k]
    if v == nil then
      error("Script attempted to access nonexistent global variable '" .. tostring(k) .. "'", 2)
    end
    return v
  end,
  __newindex = ro_error,
  __metatable = {},
})
readonly[script_env] = true
env._G = script_env
env.loadstring = function(body, name)
  local f, msg = loadstring(body, name)
  if f then setfenv(f, script_env) end
  return f, msg
end
env.load = function(reader, name)
  local f, msg = load(reader, name)
  if f then setfenv(f, script_env) end
  return f, msg
end
-- strings' methods through the read-only library, the metatable out of reach
local smeta = getmetatable('')
smeta.__index = env.string
smeta.__metatable = {__index = env.string}

local function handler(e)
  local lvl = 2
  local i = dbg_getinfo(lvl, 'nSl')
  while i and (i.what == 'C' or i.source == '=prelude') do
    lvl = lvl + 1
    i = dbg_getinfo(lvl, 'nSl')
  end
  if type(e) ~= 'table' then
    e = {err = 'ERR ' .. tostring(e)}
  end
  if i and i.source ~= '=[C]' then
    e.source = i.source
    e.line = i.currentline
  end
  return e
end

local function compile(body, chunkname)
  local f, msg = loadstring(body, chunkname)
  if not f then return nil, msg end
  setfenv(f, script_env)
  return f
end

-- SCRIPT KILL: checked every 10000 instructions, as Redis's count hook; once killed,
-- every check raises again, so a pcall cannot swallow it.
local function kill_hook()
  if pykilled() then
    error({err = 'ERR Script killed by user with SCRIPT KILL...'})
  end
end

local function run(f, keys, argv)
  env.KEYS, env.ARGV = keys, argv
  dbg_sethook(kill_hook, '', 10000)
  local ok, v = xpcall(f, handler)
  dbg_sethook()
  return ok, v
end

-- Functions (FUNCTION LOAD, FCALL), as redis-server 7.0 runs them: a library's chunk
-- runs once, at load, seeing only redis.register_function, redis.log and the version
-- constants; its callbacks later run with the scripts' globals, without KEYS and ARGV.
local registering = nil
local FLAGS = {['no-writes'] = true, ['allow-oom'] = true, ['allow-stale'] = true,
               ['no-cluster'] = true, ['allow-cross-slot-keys'] = true}
local function reg_error(msg) error({err = 'ERR ' .. msg}) end
local function is_string(v) return type(v) == 'string' or type(v) == 'number' end
local function named_args(t)
  local name, callback, flags, description
  for k, v in pairs(t) do
    if type(k) ~= 'string' then
      reg_error('named argument key given to redis.register_function is not a string')
    elseif k == 'function_name' then
      if not is_string(v) then
        reg_error('function_name argument given to redis.register_function must be a string')
      end
      name = tostring(v)
    elseif k == 'description' then
      if not is_string(v) then
        reg_error('description argument given to redis.register_function must be a string')
      end
      description = tostring(v)
    elseif k == 'callback' then
      if type(v) ~= 'function' then
        reg_error('callback argument given to redis.register_function must be a function')
      end
      callback = v
    elseif k == 'flags' then
      if type(v) ~= 'table' then
        reg_error('flags argument to redis.register_function must be a table ' ..
                  'representing function flags')
      end
      flags = {}
      local i = 1
      while v[i] ~= nil do
        if type(v[i]) ~= 'string' or not FLAGS[v[i]] then reg_error('unknown flag given') end
        flags[#flags + 1] = v[i]
        i = i + 1
      end
    else
      reg_error('unknown argument given to redis.register_function')
    end
  end
  if name == nil then reg_error('redis.register_function must get a function name argument') end
  if callback == nil then reg_error('redis.register_function must get a callback argument') end
  return name, callback, flags, description
end
local function register(...)
  local n = select('#', ...)
  local name, callback, flags, description
  if n == 1 then
    if type(...) ~= 'table' then
      reg_error('calling redis.register_function with a single argument is only applicable ' ..
                'to Lua table (representing named arguments).')
    end
    name, callback, flags, description = named_args(...)
  elseif n == 2 then
    name, callback = ...
    if not is_string(name) then
      reg_error('first argument to redis.register_function must be a string')
    end
    if type(callback) ~= 'function' then
      reg_error('second argument to redis.register_function must be a function')
    end
  else
    reg_error('wrong number of arguments to redis.register_function')
  end
  name = tostring(name)
  if not name:find('^[%w_]+$') then  -- redis-server 7.0's text says "Library"
    reg_error('Library names can only contain letters, numbers, or underscores(_) and ' ..
              'must be at least one character long')
  end
  if registering.seen[name] then reg_error('Function already exists in the library') end
  registering.seen[name] = true
  registering.list[#registering.list + 1] = {name, callback, flags or {}, description}
end
local load_redis = {register_function = register, log = redis.log,
                    REDIS_VERSION = version, REDIS_VERSION_NUM = version_num}
for _, k in ipairs({'LOG_DEBUG', 'LOG_VERBOSE', 'LOG_NOTICE', 'LOG_WARNING'}) do
  load_redis[k] = redis[k]
end
local function nonexistent(k)
  error("Script attempted to access nonexistent global variable '" .. tostring(k) .. "'", 3)
end
local load_redis_view = setmetatable({}, {
  __index = function(_, k)
    local v = load_redis[k]
    if v == nil then nonexistent(k) end
    return v
  end,
  __newindex = ro_error,
  __metatable = false,
})
readonly[load_redis_view] = true
local lib_env = setmetatable({}, {
  __index = function(_, k)
    if registering then
      if k == 'redis' then return load_redis_view end
    elseif k == 'rawset' then
      return cowrap(checked_rawset)
    elseif k ~= 'KEYS' and k ~= 'ARGV' and env[k] ~= nil then
      return env[k]
    end
    nonexistent(k)
  end,
  __newindex = ro_error,
  __metatable = {},
})
readonly[lib_env] = true

-- A library's code that runs past 500 ms at load is stopped, as redis-server's
-- luaEngineLoadHook does (checked every 100000 instructions).
local load_deadline = 0
local function load_hook()
  if pynow() > load_deadline then error({err = 'ERR FUNCTION LOAD timeout'}) end
end

-- FUNCTION LOAD: (true, {{name, callback, flags, description}, ...}) or
-- (false, 'compile' | 'run', message)
local function load_library(body)
  local f, msg = loadstring(body, '@user_function')
  if not f then return false, 'compile', msg end
  setfenv(f, lib_env)
  registering = {seen = {}, list = {}}
  load_deadline = pynow() + 0.5
  dbg_sethook(load_hook, '', 100000)
  local ok, e = pcall(f)
  dbg_sethook()
  local got = registering
  registering = nil
  if not ok then
    if type(e) == 'table' and type(rawget(e, 'err')) == 'string' then
      return false, 'run', rawget(e, 'err')
    end
    return false, 'run', 'ERR ' .. tostring(e)
  end
  return true, got.list
end

local function run_function(f, keys, args)
  dbg_sethook(kill_hook, '', 10000)
  local ok, v = xpcall(function() return f(keys, args) end, handler)
  dbg_sethook()
  return ok, v
end

return compile, run, load_library, run_function
"""
