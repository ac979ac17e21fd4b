"""A ValidatingAdmissionPolicy evaluated the way kube-apiserver does, with cel-python.

``PolicyEvaluator(policy, params).admit(request, obj, old)`` runs the policy's variables
(in order, each visible to the later ones as ``variables.<name>``) and validations on one
AdmissionRequest-shaped request, and returns the messages of the validations that deny it.
An expression that fails to evaluate denies too (the policy's failurePolicy is Fail).
``object`` is None only for DELETE, ``oldObject`` None for CREATE, as in Kubernetes.

The one Kubernetes CEL library function the policy uses beyond standard CEL, the strings
extension's ``<list>.join(<separator>)``, is supplied here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import celpy
from celpy import celtypes


def _join(items: Any, separator: Any = "") -> celtypes.StringType:
    return celtypes.StringType(str(separator).join(str(item) for item in items))


FUNCTIONS = {"join": _join}


@dataclass
class Verdict:
    denied: list[str] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return not self.denied


class PolicyEvaluator:
    def __init__(self, policy: dict, params: dict | None) -> None:
        spec = policy["spec"]
        self.env = celpy.Environment()
        self.params = params
        self.variables = [(v["name"], self._compile(v["expression"])) for v in spec.get("variables", [])]
        self.validations = [
            (self._compile(v["expression"]),
             self._compile(v["messageExpression"]) if "messageExpression" in v else None,
             v.get("message", v["expression"]))
            for v in spec["validations"]
        ]
        self.match_conditions = [self._compile(m["expression"]) for m in spec.get("matchConditions", [])]
        self.rules = spec["matchConstraints"]["resourceRules"]

    def _compile(self, expression: str) -> Any:
        return self.env.program(self.env.compile(expression), functions=FUNCTIONS)

    def matches(self, request: dict) -> bool:
        resource = request["resource"]["resource"]
        if request.get("subResource"):
            resource += "/" + request["subResource"]
        return any(request["operation"] in rule["operations"] and resource in rule["resources"]
                   and request["resource"]["group"] in rule["apiGroups"] for rule in self.rules)

    def admit(self, request: dict, obj: dict | None, old: dict | None) -> Verdict:
        if not self.matches(request):
            return Verdict()
        activation: dict[str, Any] = {
            "request": celpy.json_to_cel(request),
            "object": celpy.json_to_cel(obj),
            "oldObject": celpy.json_to_cel(old),
            "params": celpy.json_to_cel(self.params),
        }
        for condition in self.match_conditions:
            if not condition.evaluate(activation):
                return Verdict()
        values: dict[str, Any] = {}
        for name, program in self.variables:
            activation["variables"] = celtypes.MapType(values)
            try:
                values[celtypes.StringType(name)] = program.evaluate(activation)
            except celpy.CELEvalError as error:  # used later, it denies (failurePolicy: Fail)
                values[celtypes.StringType(name)] = error
        activation["variables"] = celtypes.MapType(values)
        verdict = Verdict()
        for program, message_program, message in self.validations:
            try:
                passed = program.evaluate(activation)
            except celpy.CELEvalError as error:
                verdict.denied.append(f"evaluation error: {error}")
                continue
            if isinstance(passed, celpy.CELEvalError):
                verdict.denied.append(f"evaluation error: {passed}")
            elif not (isinstance(passed, celtypes.BoolType) and bool(passed)):
                if message_program is not None:
                    message = str(message_program.evaluate(activation))
                verdict.denied.append(message)
        return verdict
