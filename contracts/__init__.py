"""Contracts: TOML files of clauses on variant metrics, and the checker that turns an evaluation into a verdict."""

from contracts.checker import (
    Clause,
    ClauseResult,
    Contract,
    ContractError,
    Verdict,
    check,
    contract_from_dict,
    load_contract,
)

__all__ = [
    "Clause",
    "ClauseResult",
    "Contract",
    "ContractError",
    "Verdict",
    "check",
    "contract_from_dict",
    "load_contract",
]
