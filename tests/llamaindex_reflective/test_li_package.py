import subprocess
import sys

import llamaindex_reflective


def test_all_is_exact_and_importable():
    assert sorted(llamaindex_reflective.__all__) == sorted(
        [
            "LlamaIndexLLM",
            "ReflectiveEmbedding",
            "LlamaIndexEmbedder",
            "ReflectiveNodePostprocessor",
            "ReflectiveChatStore",
            "ReflectiveDBChatStore",
            "ReflectiveMemoryBlock",
            "INSTALL_HINT",
        ]
    )
    for name in llamaindex_reflective.__all__:
        assert getattr(llamaindex_reflective, name) is not None
    import llamaindex_reflective.chat_store as cs
    import llamaindex_reflective.embeddings as em
    import llamaindex_reflective.llm as llm
    import llamaindex_reflective.memory_block as mb
    import llamaindex_reflective.postprocessor as pp

    for mod in (cs, em, llm, mb, pp):
        for name in mod.__all__:
            assert hasattr(mod, name), (mod.__name__, name)


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_shared_never_imports_llama_index():
    out = _run(
        "import sys, reflective_memory\n"
        "from reflective_memory import ReflectiveMemory, HashingEmbedder\n"
        "m = ReflectiveMemory(embedder=HashingEmbedder()); m.add_turn('u','s','user','hi')\n"
        "m.end_session('u','s'); m.retrieve('u','hi')\n"
        "bad = [k for k in sys.modules if k.startswith('llama_index')]\n"
        "assert not bad, bad\n"
    )
    assert out.returncode == 0, out.stderr


def test_missing_llama_index_gives_install_message():
    out = _run(
        "import sys\n"
        "sys.modules['llama_index'] = None\n"
        "sys.modules['llama_index.core'] = None\n"
        "try:\n"
        "    import llamaindex_reflective\n"
        "except ImportError as e:\n"
        "    print(e)\n"
        "else:\n"
        "    raise SystemExit('imported without llama_index')\n"
    )
    assert out.returncode == 0, out.stderr
    assert "pip install reflective-memory[llamaindex]" in out.stdout
