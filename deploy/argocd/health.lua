-- Argo CD health check for training.puretransformer.dev/TrainingRun.
-- Add it to argocd-cm as resource.customizations.health.training.puretransformer.dev_TrainingRun
-- (see deploy/argocd/README.md). Runs under Lua 5.1, as Argo CD does.
local hs = { status = "Progressing", message = "Waiting for the operator to report status" }

local function condition(status, type_)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == type_ then
      return c
    end
  end
  return nil
end

local function progress(status)
  local p = status.progress
  if p ~= nil and p.percent ~= nil then
    -- Argo CD runs health checks without the string and math libraries: tenths by hand,
    -- a half to even, as string.format("%.1f") would.
    local scaled = p.percent * 10
    local tenths = scaled - scaled % 1
    local rest = scaled - tenths
    if rest > 0.5 or (rest == 0.5 and tenths % 2 == 1) then
      tenths = tenths + 1
    end
    local whole = (tenths - tenths % 10) / 10
    return " (" .. tostring(whole) .. "." .. tostring(tenths % 10) .. "% of the token budget)"
  end
  return ""
end

if obj.status == nil then
  return hs
end
local status = obj.status

-- A status older than the spec says nothing about the spec yet.
local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.message = "The operator has not yet observed generation " .. tostring(generation)
  return hs
end

local phase = status.phase
if phase == "Failed" then
  hs.status = "Degraded"
  local failed = condition(status, "Failed")
  if failed ~= nil and failed.message ~= nil and failed.message ~= "" then
    hs.message = failed.message
  else
    hs.message = "Failed: " .. tostring(status.reason or "unknown reason")
  end
  return hs
end
if phase == "Succeeded" then
  hs.status = "Healthy"
  local done = condition(status, "Succeeded")
  hs.message = (done and done.message ~= "" and done.message) or "Training completed"
  return hs
end
if phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = "Suspended" .. progress(status)
  return hs
end
-- A change the run cannot take: the run goes on as it was, not as Git says.
local accepted = condition(status, "Accepted")
if accepted ~= nil and accepted.status == "False" and accepted.reason == "ChangeRefused" then
  hs.status = "Degraded"
  hs.message = accepted.message
  return hs
end
-- A running run that wastes its GPUs, in the words of the condition that says so:
-- GRPO steps that teach nothing, a straggling rank every step waits for, or no step at all.
for _, type_ in ipairs({ "NoLearningSignal", "Straggler", "Stalled" }) do
  local c = condition(status, type_)
  if phase == "Running" and c ~= nil and c.status == "True" then
    hs.status = "Degraded"
    hs.message = (c.message ~= nil and c.message ~= "" and c.message) or ("Running with " .. type_)
    return hs
  end
end
-- Waiting for Kueue to admit its Job, in the words of the condition that names the queue.
local queued = condition(status, "Queued")
if queued ~= nil and queued.status == "True" and queued.message ~= nil and queued.message ~= "" then
  hs.message = queued.message
  return hs
end
hs.message = tostring(phase or "Pending") .. progress(status)
if status.reason ~= nil and status.reason ~= "" then
  hs.message = hs.message .. ": " .. status.reason
end
return hs
