"""The served model as the server itself uses it: hidden calls, token counts of long texts, the chat template check."""
