-- message.lua: The stored broker message of a call, as each delivery pushes it.

-- The broker message of a call stored as one (wire.py): release.lua pushes it, sweep.lua looks for it in its list.
-- A later delivery says so (wire.py's ``redelivered``, byte for byte): "redelivered" and "x-delivery-count" (the
-- deliveries before it) at the start of the headers, "redelivered" at the start of delivery_info, the last
-- object opened in the message.
local HEADERS, DELIVERY_INFO = '"headers": {', '"delivery_info": {'
local function redelivered(message, earlier)
    local head = string.find(message, HEADERS, 1, true)
    local info, from = nil, 1
    while true do
        local found = string.find(message, DELIVERY_INFO, from, true)
        if not found then
            break
        end
        info, from = found, found + 1
    end
    if not head or not info or info < head then
        return message
    end
    local head_end, info_end = head + #HEADERS - 1, info + #DELIVERY_INFO - 1
    local marks = '"redelivered": true, "x-delivery-count": ' .. string.format('%d', earlier)
    if string.sub(message, head_end + 1, head_end + 1) ~= '}' then
        marks = marks .. ', '
    end
    local flag = '"redelivered": true'
    if string.sub(message, info_end + 1, info_end + 1) ~= '}' then
        flag = flag .. ', '
    end
    return string.sub(message, 1, head_end) .. marks .. string.sub(message, head_end + 1, info_end) .. flag
        .. string.sub(message, info_end + 1)
end

-- The message to push for this delivery, or nil when the payload is not a broker message of this call.
-- wire.py writes the delivery tag of the first delivery last: the message ends with it.
local function message_for(id, payload, delivery)
    local ending = '"delivery_tag": "' .. id .. '.1"}}'
    if string.sub(payload, 1, #MESSAGE_PREFIX) ~= MESSAGE_PREFIX or string.sub(payload, -#ending) ~= ending then
        return nil
    elseif delivery == 1 then
        return payload
    end
    local tagged = string.sub(payload, 1, -#ending - 1) .. '"delivery_tag": "' .. id .. '.' .. delivery .. '"}}'
    return redelivered(tagged, delivery - 1)
end
