from setuptools import find_packages, setup

EXTRAS = {
    # numba-cuda (0.30.4, in maintenance) does not import under NumPy 2.5, which removed np.row_stack
    "gpu": ["cupy-cuda12x>=13", "numba-cuda[cu12]>=0.20", "numpy<2.5"],
    "mpi": ["mpi4py>=4.0", "mpich>=4.2"],
    "test": ["pytest>=8", "pytest-benchmark>=4", "hypothesis>=6.100"],
    "plots": ["matplotlib>=3.8"],
    "bench": ["rocksdict>=0.3", "lmdb>=1.4"],       # the SSD-PS benchmark's peers
}
EXTRAS["all"] = sorted({dep for deps in EXTRAS.values() for dep in deps})

setup(
    name="hps",
    version="0.1.0",
    description="Hierarchical GPU/DRAM/SSD parameter server for CTR embedding models (Numba/CuPy)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["hps", "hps.*"]),
    install_requires=[
        "numpy>=1.26",
        "numba>=0.60",
        "h5py>=3.10",
        "isal>=1.6",
        "tqdm>=4.66",
        "pyarrow>=15",
        "zstandard>=0.22",
        "threadpoolctl>=3.1",
        "tomli>=2.0; python_version<'3.11'",
    ],
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["hps-train=hps.train:main", "hps-predict=hps.train._cli:predict_main"]},
)
