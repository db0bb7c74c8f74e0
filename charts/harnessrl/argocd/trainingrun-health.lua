-- Argo CD health of a harnessrl.io/TrainingRun, from its conditions (by type, never by position).
local hs = {status = "Progressing", message = "waiting for the operator"}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  hs.message = "the operator has not seen the latest spec yet"
  return hs
end
local c = {}
for _, cond in ipairs(obj.status.conditions) do
  c[cond.type] = cond
end
local function is_true(t) return c[t] ~= nil and c[t].status == "True" end
-- Reasons that need a person: the run will not progress on its own.
local trouble = {
  ImagePullBackOff = true, InsufficientGPU = true, Unschedulable = true, CrashLoopBackOff = true,
  ConfigError = true, HarnessPoolNotFound = true, InvalidSpec = true, HubExportFailing = true,
}
if is_true("Failed") then
  hs.status = "Degraded"; hs.message = c.Failed.message
elseif is_true("Complete") then
  hs.status = "Healthy"; hs.message = c.Complete.message
elseif is_true("Suspended") then
  hs.status = "Suspended"; hs.message = c.Suspended.message
elseif c.Training ~= nil and trouble[c.Training.reason] then
  hs.status = "Degraded"; hs.message = c.Training.message
elseif c.Ready ~= nil and c.Ready.status ~= "True" and trouble[c.Ready.reason] then
  hs.status = "Degraded"; hs.message = c.Ready.message
elseif is_true("Training") then
  hs.status = "Healthy"; hs.message = c.Training.message
elseif c.Training ~= nil then
  hs.message = c.Training.message
end
return hs
