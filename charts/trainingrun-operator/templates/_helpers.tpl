{{/* The release's full name, at most 63 characters. */}}
{{- define "trainingrun-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "trainingrun-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "trainingrun-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The operator pods' selector; app.kubernetes.io/name is also the scrape job's name. */}}
{{- define "trainingrun-operator.selectorLabels" -}}
app.kubernetes.io/name: trainingrun-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "trainingrun-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "trainingrun-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "trainingrun-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "trainingrun-operator.trainerImage" -}}
{{- printf "%s:%s" .Values.trainerImage.repository (default .Chart.AppVersion .Values.trainerImage.tag) -}}
{{- end -}}
