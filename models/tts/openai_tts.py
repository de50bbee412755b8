class OpenAITTS:  # placeholder
    pass
