"""The turn every generating door (chat completions, Messages, Responses) runs:

    turn_pipeline.py  TurnPipeline: wait → resolve → orchestrate → admit → record → generate through
                      vLLM's route → settle; DoorCall, what a door brings to it
    turn_stream.py    TurnStream: a streamed reply that owns its turn until the response is over
    door.py           what every door does over HTTP: its route ahead of vLLM's, its log line and span
"""
