-- lex.lua: Members of the lex-ordered sets (gated, slots, waits, paused): parts joined by NUL.

local NUL, AFTER_NUL = '\0', '\1'

local function lex_range(prefix)
    return '[' .. prefix .. NUL, '(' .. prefix .. AFTER_NUL
end
