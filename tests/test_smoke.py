from celery_redisdelay import RedisDelay


def test_park_and_tick(rd: RedisDelay) -> None:
    @rd.delayed
    def charge(order_id: int) -> int:
        return order_id

    result = charge.apply_async((42,), countdown=0)
    entry = rd.find(result.id)
    assert entry is not None
    assert entry.state == "delayed"
