-- lua5.1 deploy/argocd/health_test.lua: runs health.lua the way Argo CD does (a global
-- `obj`, the script's return value) on each status fixture and checks the result.
local dir = arg and arg[0] and arg[0]:match("^(.*)/[^/]*$") or "."
local script = assert(loadfile(dir .. "/health.lua"))

-- Argo CD's VM opens only the base, package, table and a safe os library for a
-- custom health check (util/lua, UseOpenLibs false): the same here.
local sandbox = { ipairs = ipairs, pairs = pairs, tostring = tostring, tonumber = tonumber, type = type,
  next = next, select = select, error = error, pcall = pcall, table = table }
setfenv(script, sandbox)

local function run(o)
  sandbox.obj = o
  return script()
end

local function cond(type_, status, reason, message)
  return { type = type_, status = status, reason = reason, message = message or "" }
end

local fixtures = {
  {
    name = "no status yet",
    obj = { metadata = { generation = 1 } },
    status = "Progressing",
    message = "Waiting for the operator",
  },
  {
    name = "a status older than the spec",
    obj = { metadata = { generation = 3 }, status = { observedGeneration = 2, phase = "Failed", reason = "NaNLoss" } },
    status = "Progressing",
    message = "not yet observed generation 3",
  },
  {
    name = "a status without observedGeneration",
    obj = { metadata = { generation = 1 }, status = { phase = "Succeeded" } },
    status = "Progressing",
    message = "not yet observed generation 1",
  },
  {
    name = "failed with the condition's message",
    obj = {
      metadata = { generation = 2 },
      status = {
        observedGeneration = 2,
        phase = "Failed",
        reason = "NaNLoss",
        conditions = { cond("Running", "False", "NaNLoss"), cond("Failed", "True", "NaNLoss", "step 1200: non-finite loss (nan)") },
      },
    },
    status = "Degraded",
    message = "step 1200: non-finite loss (nan)",
  },
  {
    name = "failed without conditions",
    obj = { metadata = { generation = 1 }, status = { observedGeneration = 1, phase = "Failed", reason = "OutOfMemory" } },
    status = "Degraded",
    message = "Failed: OutOfMemory",
  },
  {
    name = "succeeded",
    obj = {
      metadata = { generation = 1 },
      status = { observedGeneration = 1, phase = "Succeeded", conditions = { cond("Succeeded", "True", "Completed", "trained 2M tokens in 244 steps") } },
    },
    status = "Healthy",
    message = "trained 2M tokens in 244 steps",
  },
  {
    name = "suspended",
    obj = { metadata = { generation = 4 }, status = { observedGeneration = 4, phase = "Suspended", progress = { percent = 42.5 } } },
    status = "Suspended",
    message = "42.5%",
  },
  {
    name = "running but stalled",
    obj = {
      metadata = { generation = 1 },
      status = {
        observedGeneration = 1,
        phase = "Running",
        conditions = { cond("Running", "True", "Training"), cond("Stalled", "True", "NoProgress", "no step for 31m") },
      },
    },
    status = "Degraded",
    message = "no step for 31m",
  },
  {
    name = "running and progressing",
    obj = {
      metadata = { generation = 1 },
      status = {
        observedGeneration = 1,
        phase = "Running",
        progress = { percent = 12.25 },
        conditions = { cond("Running", "True", "Training"), cond("Stalled", "False", "Progressing") },
      },
    },
    status = "Progressing",
    message = "Running (12.2% of the token budget)",
  },
  {
    name = "waiting for the init run",
    obj = { metadata = { generation = 1 }, status = { observedGeneration = 1, phase = "Waiting", reason = "WaitingForInitRun" } },
    status = "Progressing",
    message = "Waiting: WaitingForInitRun",
  },
  {
    name = "restarting after a retriable failure",
    obj = { metadata = { generation = 1 }, status = { observedGeneration = 1, phase = "Restarting", reason = "CollectiveTimeout" } },
    status = "Progressing",
    message = "Restarting: CollectiveTimeout",
  },
  {
    name = "running under a refused change",
    obj = {
      metadata = { generation = 3 },
      status = {
        observedGeneration = 3,
        phase = "Running",
        reason = "Training",
        conditions = { cond("Accepted", "False", "ChangeRefused", "refused: spec.batch.globalTokens (batch.globalSequences: 8 → 16)") },
      },
    },
    status = "Degraded",
    message = "spec.batch.globalTokens",
  },
  {
    name = "a GRPO run without learning signal",
    obj = {
      metadata = { generation = 1 },
      status = {
        observedGeneration = 1,
        phase = "Running",
        reason = "Training",
        conditions = { cond("NoLearningSignal", "True", "NoLearningSignal", "for 20 steps in a row at least 90% of the prompt groups got equal rewards") },
      },
    },
    status = "Degraded",
    message = "for 20 steps in a row",
  },
  {
    name = "a run with a straggling rank",
    obj = {
      metadata = { generation = 1 },
      status = {
        observedGeneration = 1,
        phase = "Running",
        reason = "Training",
        conditions = { cond("Straggler", "True", "Straggler", "rank 1 (llm-a1-1-x on node gpu-7) takes 2.25× the other ranks' median work per step") },
      },
    },
    status = "Degraded",
    message = "rank 1 (llm-a1-1-x on node gpu-7)",
  },
  {
    name = "a run whose ranks keep pace",
    obj = {
      metadata = { generation = 1 },
      status = {
        observedGeneration = 1,
        phase = "Running",
        reason = "Training",
        conditions = { cond("Straggler", "False", "NoStraggler") },
      },
    },
    status = "Progressing",
    message = "Running",
  },
  {
    name = "restarting after a NaN, rolled back",
    obj = {
      metadata = { generation = 1 },
      status = {
        observedGeneration = 1,
        phase = "Restarting",
        reason = "NaNRollback",
        conditions = { cond("RolledBack", "True", "NaNRollback", "1 of 2 rollbacks after non-finite steps") },
      },
    },
    status = "Progressing",
    message = "Restarting: NaNRollback",
  },
  {
    name = "restarting at a new size",
    obj = { metadata = { generation = 2 }, status = { observedGeneration = 2, phase = "Restarting", reason = "Resized" } },
    status = "Progressing",
    message = "Restarting: Resized",
  },
}

local failed = 0
for _, f in ipairs(fixtures) do
  local hs = run(f.obj)
  local ok = hs ~= nil and hs.status == f.status and hs.message ~= nil and string.find(hs.message, f.message, 1, true) ~= nil
  if ok then
    print("ok   " .. f.name .. ": " .. hs.status .. " (" .. hs.message .. ")")
  else
    failed = failed + 1
    print(string.format("FAIL %s: got %s (%s), want %s (…%s…)", f.name, tostring(hs and hs.status), tostring(hs and hs.message), f.status, f.message))
  end
end
print(string.format("%d fixtures, %d failed", #fixtures, failed))
if failed > 0 then
  os.exit(1)
end
