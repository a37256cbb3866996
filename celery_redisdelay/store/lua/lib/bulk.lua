-- bulk.lua: commands with more arguments than Lua's unpack takes at once.

-- Run a command with many arguments in chunks (Lua's unpack has a limit).
local function bulk(command, key, args)
    for i = 1, #args, 1000 do
        redis.call(command, key, unpack(args, i, math.min(i + 999, #args)))
    end
end

-- The same for a command that reads: each(j, reply) is given each argument's index and its reply.
local function bulk_read(command, key, args, each)
    for i = 1, #args, 1000 do
        local last = math.min(i + 999, #args)
        local replies = redis.call(command, key, unpack(args, i, last))
        for j = i, last do
            each(j, replies[j - i + 1])
        end
    end
end
