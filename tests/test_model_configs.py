

def _deep_json(depth: int) -> str:
    return '{"weight_map": ' + "[" * depth + "]" * depth + "}"


# Files of a model folder no reader may hang on or overflow: each refused naming the file.
GUARDS = {
    "a 200,000-deep config.json": (lambda f: (f / "config.json").write_text("[" * 200_000 + "]" * 200_000),
                                   "config.json nests deeper than 64 levels"),
    "a 200,000-deep index": (lambda f: (f / "model.safetensors.index.json").write_text(_deep_json(200_000)),
                             "model.safetensors.index.json nests deeper than 64 levels"),
    "a deep tokenizer_config.json": (lambda f: (f / "tokenizer_config.json").write_text(_deep_json(5_000)),
                                     "tokenizer_config.json nests deeper than 64 levels"),
    "a config.json that is a FIFO": (lambda f: ((f / "config.json").unlink(), os.mkfifo(f / "config.json")),
                                     "'config.json' in .* is a pipe \\(FIFO\\), not a file"),
    "a generation config that is a FIFO": (
        lambda f: ((f / "generation_config.json").unlink(), os.mkfifo(f / "generation_config.json")),
        "'generation_config.json' in .* is a pipe \\(FIFO\\)"),
    "a chat template that loops for ever": (lambda f: (f / "chat_template.jinja").write_text(ENDLESS_TEMPLATE),
                                            "chat template did not finish rendering in 2 s"),
    "a model_max_length of text": (
        lambda f: (f / "tokenizer_config.json").write_text(json.dumps(
            {**json.loads((f / "tokenizer_config.json").read_text()), "model_max_length": "8"})),
        "the tokenizer in .* does not encode a prompt \\(TypeError"),
}


@pytest.mark.parametrize("case", GUARDS)
def test_a_folder_no_reader_may_hang_on_is_refused_by_info_with_exit_2(tmp_path, capsys, case):
    change, message = GUARDS[case]
    folder = tmp_path / "m"
    shutil.copytree(MODELS / "tiny-llada2", folder)
    change(folder)
    assert _within(30, lambda: cli_main(["info", str(folder)])) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and pytest.importorskip("re").search(message, err), err


def test_a_crafted_config_is_exit_2_with_its_key_for_info_and_generate(tmp_path, capsys):
    moe = _craft(tmp_path / "moe", "tiny-llada2", n_group=0)
    canvas = _craft(tmp_path / "canvas", "tiny-diffusiongemma", "generation_config.json", t_max=0.1)
    for argv, key in ((["info", str(moe)], "n_group 0"),
                      (["generate", "--model", str(canvas), "--prompt", "1+1=", "--quiet"], "t_max (0.1)")):
        assert cli_main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and key in err and "Traceback" not in err, err
